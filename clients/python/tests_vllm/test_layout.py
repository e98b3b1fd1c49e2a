"""The pure parts both sides must agree on: copy plans, slot geometry,
namespaces. No engine, no daemon."""

import numpy as np
import pytest

from kvtier_vllm.layout import (
    KvtierConfigError,
    SlotGeometry,
    copy_plan,
    layout_namespace,
    tensor_offsets,
)


def plan(*args):
    return [(g.group, g.blocks.tolist(), g.slots.tolist(), g.subs.tolist())
            for g in copy_plan(*args)]


def test_one_block_per_chunk_pairs_blocks_with_slots():
    assert plan([5, 6, 7], [3], [0], [10, 11, 12], 1) == [(0, [5, 6, 7], [10, 11, 12], [0, 0, 0])]


def test_chunks_of_two_blocks_fill_sub_blocks_in_order():
    assert plan([5, 6, 7, 8], [4], [0], [10, 11], 2) == \
        [(0, [5, 6, 7, 8], [10, 10, 11, 11], [0, 1, 0, 1])]


def test_a_group_entering_its_first_chunk_part_way_skips_its_sub_blocks():
    # logical blocks 3..5 of a request with chunks of 2: block 3 is the second
    # half of chunk 1 (slot 20), blocks 4, 5 fill chunk 2 (slot 21)
    assert plan([7, 8, 9], [3], [3], [20, 21], 2) == \
        [(0, [7, 8, 9], [20, 21, 21], [1, 0, 1])]


def test_groups_take_their_own_blocks_and_slots_and_skip_empty_groups():
    got = plan([1, 2, 3, 4, 5], [2, 0, 3], [0, 0, 1], [10, 11, 12], 2)
    assert got == [(0, [1, 2], [10, 10], [0, 1]),
                   (2, [3, 4, 5], [11, 12, 12], [1, 0, 1])]


@pytest.mark.parametrize("blocks,sizes,first,slots", [
    ([1, 2, 3], [3], [0], [10]),          # too few slots
    ([1, 2], [3], [0], [10, 11, 12]),     # too few blocks
    ([1, 2, 3], [2], [0], [10, 11]),      # blocks left over
    ([1, 2], [2], [0], [10, 11, 12]),     # slots left over
])
def test_a_spec_that_does_not_add_up_is_refused(blocks, sizes, first, slots):
    with pytest.raises(ValueError):
        plan(blocks, sizes, first, slots, 2 if len(slots) != len(blocks) else 1)


def test_slot_geometry_refuses_slots_too_small_and_says_what_fits():
    g = SlotGeometry(world_size=2, blocks_per_chunk=2, shard_bytes=32768)
    g.check(65536)
    with pytest.raises(KvtierConfigError, match="--block-bytes 65536"):
        g.check(65535)


def test_tensor_offsets_follow_one_another():
    assert tensor_offsets([100, 200, 50], 2) == [0, 200, 600]


def test_namespace_changes_with_every_layout_fact():
    base = {"model": "m", "dtype": "bfloat16", "tokens_per_block": [32], "world": [1, 1],
            "salt": "", "root_hash": "abc"}
    ns = layout_namespace(base)
    assert ns == layout_namespace(dict(base)) and len(ns) <= 64
    for k, v in [("model", "m2"), ("dtype", "float16"), ("tokens_per_block", [16]),
                 ("world", [2, 2]), ("salt", "tenant"), ("root_hash", "def")]:
        assert layout_namespace({**base, k: v}) != ns, k


def test_copy_plan_moves_every_byte_to_its_sub_block():
    """End to end over numpy arrays standing in for the engine tensor and
    the pool view: store then load round-trips every block exactly."""
    rng = np.random.default_rng(0)
    engine = rng.integers(0, 255, size=(16, 8), dtype=np.uint8)
    pool = np.zeros((6, 2, 8), dtype=np.uint8)  # slots x blocks_per_chunk x page
    blocks, slots = [3, 9, 4, 11, 2], [4, 1, 5]
    for g in copy_plan(blocks, [5], [1], slots, 2):
        pool[g.slots, g.subs] = engine[g.blocks]
    back = np.zeros_like(engine)
    for g in copy_plan(blocks, [5], [1], slots, 2):
        back[g.blocks] = pool[g.slots, g.subs]
    assert (back[blocks] == engine[blocks]).all()
    assert (pool[4, 0] == 0).all(), "the skipped first sub-block is untouched"
