"""Context-parallel attention modes, declared once (torch-free): what each needs, what
plan-parallel gives its sites, what memory counts for it and what legality checks of it.

Invariants:
- MODES holds every mode a planned attention site may carry; CHOICES (every mode but `local`,
  which only a site with replicated keys or cp = 1 gets) is what `--attention`, parse_parallel,
  enumerate_configs and the target tables' `attention_modes` name; DEFAULT is the mode of
  a cp > 1 plan given no --attention.
- A mode's torch implementation is `IMPLEMENTATIONS[name]` in difflet/parallel/joint_attention.py
  (tests/test_parallel_attention.py checks that both name the same modes).
- Lengths of one fused call on a rank are read from the site's streams: `full` = the whole
  stream, `local` = this rank's part (CP shards only the visual stream), `shard` = one visual
  shard (one ring step).
Adding a mode: declare it here, implement it in parallel/joint_attention.py, and list it in the
`attention_modes` of the target tables that run it.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Exchange:
    """One collective a mode adds over the cp group around its site (a layout `collective`)."""

    kind: str
    at: str                     # before | after | inside the attention call
    tensor: str                 # what moves, in words
    dim: int | None
    joint_only: bool = False    # only at a joint site (the replicated text rides along)


@dataclass(frozen=True)
class CpMode:
    name: str
    help: str
    heads_axes: tuple[str, ...]  # the axes dividing a site's heads: heads % (their product) == 0
    queries: str                 # query length of one call: full | local
    keys: str                    # key length of one call: full | local | shard
    exchanges: tuple[Exchange, ...] = ()
    per_shard_calls: bool = False  # one call per visual shard (+ the text), partials merged
    held: tuple[int, int] = (0, 0)  # memory: extra per-head tokens held = held[0]*q_len + held[1]*kv_len
    one_masked_call: bool = False  # legality: a masked site is one CP-sized fused call (q_len x kv_len)


LOCAL = CpMode("local", "keys replicated (or cp = 1): plain attention over this rank's keys",
               ("tp",), "local", "local")
MODES: dict[str, CpMode] = {m.name: m for m in (
    CpMode("ulysses", "all-to-all sequence shards to head shards (heads divisible by tp*cp)",
           ("tp", "cp"), "full", "full",
           (Exchange("all_to_all", "before", "q,k,v visual: scatter heads, gather sequence", 1),
            Exchange("all_to_all", "after", "out visual: scatter sequence, gather heads", 2),
            Exchange("all_gather", "after", "out text: gather heads", 2, joint_only=True)),
           held=(1, 2), one_masked_call=True),
    CpMode("ring", "visual K/V circulated shard by shard (two shards held)", ("tp",), "local", "shard",
           (Exchange("ring_shift", "inside", "k,v visual partition", 1),),
           per_shard_calls=True, held=(0, 4)),
    CpMode("gather_kv", "all-gather the visual K/V", ("tp",), "local", "full",
           (Exchange("all_gather", "before", "k,v visual", 1),), held=(0, 2), one_masked_call=True),
    LOCAL)}
CHOICES: tuple[str, ...] = tuple(n for n in MODES if n != LOCAL.name)
DEFAULT = "ulysses"
REPLICATED_QUERIES = "gather_kv"  # replicated queries (audio) over sharded keys need every visual key
SHARDED = ("joint", "visual")      # the streams CP shards (a joint stream holds the visual one)


def site_mode(chosen: str, cp: int, query: str, key: str) -> CpMode:
    """The mode of one site of a plan whose CP mode is `chosen`, from its query/key streams."""
    if cp == 1 or key not in SHARDED:
        return LOCAL                    # keys replicated (text/audio): no exchange needed
    return MODES[chosen if query in SHARDED else REPLICATED_QUERIES]


def help_text() -> str:
    """`--attention` help: every choice with its one-line description."""
    return (f"context-parallel attention mode, with cpN (default {DEFAULT}). "
            + "; ".join(f"{n}: {MODES[n].help}" for n in CHOICES))
