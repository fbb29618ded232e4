"""Tiny tokenizers for materialized checkpoints (codegen/checkpoint.py and the families'
`write_tokenizer` hooks): word-level vocabularies that know the caption words.

Invariant: caption words come first after the special tokens, so tiny tokenizers see real
prompts as real ids (not all <unk>).
"""
from __future__ import annotations

from pathlib import Path

from difflet.errors import DiffletError

CAPTION_WORDS = (
    "a an the of on in with and at by to from under over near behind front top "
    "red orange yellow green blue purple pink brown black white gray grey gold silver "
    "circle square triangle star heart cube sphere ball box ring line dot stripe "
    "cat dog fox bird fish horse cow tree flower house car boat sun moon cloud sky "
    "mountain river sea lake forest field road city street snow rain grass sand stone "
    "small big large tiny bright dark light shiny soft old new round flat tall "
    "background foreground photo painting drawing picture image portrait landscape "
    "one two three many sitting standing flying running water fire night day"
).split()



def special_ids(config: dict) -> dict[str, int]:
    """Special token ids from the encoder config; bos always gets an id (1 unless the config says)
    so every tokenizer of a checkpoint shares one vocabulary layout, whether it adds bos or not."""
    ids = {"pad": config.get("pad_token_id", 0), "eos": config.get("eos_token_id", 2)}
    bos = config.get("bos_token_id")
    ids["bos"] = bos if bos is not None else min(set(range(len(ids) + 1)) - set(ids.values()))
    return ids


def word_level_tokenizer(vocab_size: int, special: dict[str, int], clip_style: bool,
                          max_length: int, dest: Path) -> None:
    """A T5- or CLIP-style (`clip_style`: bos ... eos) word-level tokenizer, right padding."""
    from tokenizers import processors

    names = {"pad": "<pad>", "bos": "<s>", "eos": "</s>", "unk": "<unk>"}
    vocab: dict[str, int] = {names[k]: i for k, i in special.items()}
    taken = set(vocab.values())
    free = (i for i in range(vocab_size) if i not in taken)
    vocab[names["unk"]] = next(free)
    for word in CAPTION_WORDS:
        vocab.setdefault(word, next(free, None))
    for i in free:
        vocab[f"tok{i}"] = i
    vocab = {w: i for w, i in vocab.items() if i is not None}
    if max(vocab.values()) >= vocab_size:
        raise DiffletError(f"special token ids {special} do not fit vocab_size {vocab_size}", where=dest)

    eos = (names["eos"], special["eos"])
    if clip_style:
        bos = (names["bos"], special["bos"])
        post = processors.TemplateProcessing(single=f"{bos[0]} $A {eos[0]}", special_tokens=[bos, eos])
    else:
        post = processors.TemplateProcessing(single=f"$A {eos[0]}", special_tokens=[eos])
    save_word_level(vocab, dest, unk=names["unk"], post_processor=post, model_max_length=max_length,
                    pad_token=names["pad"], eos_token=names["eos"], bos_token=names["bos"],
                    padding_side="right")


def chat_vocab(vocab_size: int, pad: int, specials: list[str], words: list[str], where=None) -> dict[str, int]:
    """A Qwen-shaped word vocabulary: specials[0] at the pad id, the other specials and `words`
    (first occurrence) on the next free ids, every id left a `tok<i>` word."""
    ids = iter(i for i in range(vocab_size) if i != pad)
    vocab = {specials[0]: pad}
    for word in [*specials[1:], *words]:
        if word not in vocab:
            vocab[word] = next(ids, None)
    vocab.update({f"tok{i}": i for i in ids})
    if None in vocab.values():
        raise DiffletError(f"vocab_size {vocab_size} is too small for the tiny tokenizer", where=where)
    return vocab


def save_word_level(vocab: dict[str, int], dest: Path, *, unk: str, pre_tokenizer=None,
                    post_processor=None, **fast) -> None:
    """Save a lower-casing word-level tokenizer over `vocab` as a PreTrainedTokenizerFast
    (`fast`: its special tokens, model_max_length and padding side)."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(WordLevel(vocab, unk_token=unk))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizer if pre_tokenizer is not None else pre_tokenizers.Whitespace()
    if post_processor is not None:
        tok.post_processor = post_processor
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=unk, **fast).save_pretrained(str(dest))
