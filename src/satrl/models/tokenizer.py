"""A character-level tokenizer for the built-in tasks, in Hugging Face format.

Every character of :data:`CHARS` is one token; anything else maps to ``<unk>``. It is built with the
``tokenizers`` library and wrapped as a :class:`transformers.PreTrainedTokenizerFast`, so
``tok.save_pretrained(dir)`` followed by ``AutoTokenizer.from_pretrained(dir)`` round-trips like any hub
tokenizer.

Conventions (the pipeline relies on them):
- ``tok(prompt)["input_ids"]`` = ``[<bos>] + chars(prompt)``: BOS is prepended to every encoded text
  (a fixed first position helps a 4-layer model); ``tok(text, add_special_tokens=False)`` omits it.
- An answer is ``chars(answer) + [<eos>]``; EOS ends every completion. ``<pad>`` is id 0 and is never a
  training target.
- ``tok.decode(ids, skip_special_tokens=True)`` returns the plain characters, no separators.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, processors
from transformers import PreTrainedTokenizerFast

PAD, EOS, BOS, UNK = "<pad>", "<eos>", "<bos>", "<unk>"
SPECIALS = (PAD, EOS, BOS, UNK)  # ids 0..3 in this order
# digits, arithmetic, a little punctuation and lower-case letters (countdown-style prompts): 4 + 48 = 52
CHARS = "0123456789" + "+-*/=()" + " ,.:?" + "abcdefghijklmnopqrstuvwxyz"


def build_char_tokenizer(model_max_length: int = 64) -> PreTrainedTokenizerFast:
    """Build the character tokenizer: ``<pad>``=0, ``<eos>``=1, ``<bos>``=2, ``<unk>``=3, then CHARS."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in CHARS:
        if ch in vocab:
            raise ValueError(f"duplicate character {ch!r} in CHARS")
        vocab[ch] = len(vocab)
    # BPE with no merges = one token per character; unknown characters become <unk>.
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    core.decoder = decoders.Fuse()  # join characters without the default " " separator
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    core.add_special_tokens(list(SPECIALS))
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        eos_token=EOS,
        bos_token=BOS,
        unk_token=UNK,
        model_max_length=model_max_length,
        padding_side="left",  # left-pad prompts for batched generation
        clean_up_tokenization_spaces=False,
    )
