"""`python -m satrl` is the same program as `satrl`."""

from satrl.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
