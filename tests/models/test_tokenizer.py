"""Character tokenizer: ids, BOS/EOS conventions, round trips, HF save/load."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from satrl.models import build_char_tokenizer
from satrl.models.tokenizer import CHARS, SPECIALS

TOK = build_char_tokenizer()


def test_special_ids_and_size():
    assert [TOK.pad_token_id, TOK.eos_token_id, TOK.bos_token_id, TOK.unk_token_id] == [0, 1, 2, 3]
    assert len(TOK) == len(SPECIALS) + len(CHARS) == 52
    assert len(set(CHARS)) == len(CHARS)


def test_prompt_gets_bos_and_one_id_per_char():
    ids = TOK("123+456=")["input_ids"]
    assert ids[0] == TOK.bos_token_id
    assert len(ids) == 1 + len("123+456=")
    # ids follow CHARS order after the 4 specials
    assert ids[1:] == [4 + CHARS.index(c) for c in "123+456="]
    assert TOK("579", add_special_tokens=False)["input_ids"] == [4 + CHARS.index(c) for c in "579"]


def test_unknown_character_maps_to_unk():
    assert TOK("1%2", add_special_tokens=False)["input_ids"] == [
        4 + CHARS.index("1"),
        3,
        4 + CHARS.index("2"),
    ]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=CHARS, max_size=40))
def test_round_trip(text):
    ids = TOK(text)["input_ids"]
    assert TOK.decode(ids, skip_special_tokens=True) == text
    assert TOK.decode(ids + [TOK.eos_token_id], skip_special_tokens=True) == text


def test_save_and_autotokenizer_load(tmp_path):
    TOK.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    for text in ["123+456=", "(7 - 3) * 2 = ?", "use the numbers: 1, 2"]:
        assert loaded(text)["input_ids"] == TOK(text)["input_ids"]
        assert loaded.decode(loaded(text)["input_ids"], skip_special_tokens=True) == text
    assert (loaded.pad_token_id, loaded.eos_token_id, loaded.bos_token_id) == (0, 1, 2)
    batch = loaded(["1+1=", "12+3="], padding=True)["input_ids"]
    assert batch[0][0] == loaded.pad_token_id  # left padding for generation
