"""Test-suite root. Its presence puts tests/ on sys.path (pytest's default import mode), so every test
folder can import the shared helpers in tests/run_helpers.py."""
