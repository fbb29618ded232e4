"""The test launcher itself: a failing rank is an error in the parent carrying its traceback, not a
hang (rank-order results are exercised by every multi-rank test)."""
from __future__ import annotations

import pytest

from difflet.parallel.launch import RankError, run_ranks


def _fail_on_one(rank: int, world: int):
    import torch.distributed as dist

    if rank == 1:
        raise ValueError("rank one says no")
    return (rank, world, dist.get_world_size())


def test_failing_rank_raises_with_traceback():
    with pytest.raises(RankError, match="rank one says no"):
        run_ranks(_fail_on_one, 2, timeout=300)  # bounds a hang only: generous under load
