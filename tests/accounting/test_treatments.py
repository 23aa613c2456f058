"""Checkpoint policies as per-block treatments: the grammar, its canonical strings, its refusals."""

from __future__ import annotations

import pytest

from lmscope.accounting.memory import checkpointed_blocks
from lmscope.accounting.treatments import (
    BlockTreatments,
    check_policy_spelling,
    format_blocks,
    parse_treatments,
)


@pytest.mark.parametrize(("policy", "full", "selective", "offload"), [
    ("none", (), (), ()),
    ("block", (0, 1, 2, 3, 4, 5), (), ()),
    ("every:4", (0, 4), (), ()),
    ("blocks:1,3-4", (1, 3, 4), (), ()),
    ("selective", (), (0, 1, 2, 3, 4, 5), ()),
    ("offload:0-1", (), (), (0, 1)),
    ("blocks:0-1+selective:2-4+offload:0-2", (0, 1), (2, 3, 4), (0, 1, 2)),
    ("selective:5 + offload", (), (5,), (0, 1, 2, 3, 4, 5)),
    ("every:3+blocks:1", (0, 1, 3), (), ()),
])
def test_parts_joined_with_plus_name_each_treatment(policy, full, selective, offload):
    treated = parse_treatments(policy, 6)
    assert (treated.full, treated.selective, treated.offload) == (full, selective, offload)
    assert checkpointed_blocks(policy, 6) == full  # the fully checkpointed blocks, as callers expect
    assert parse_treatments(treated.policy, 6) == treated  # the canonical string says the same


def test_per_block_kinds_and_the_canonical_string():
    treated = parse_treatments("offload:4-5+selective:1,3+blocks:0,2", 6)
    assert treated.per_block() == [("full", False), ("selective", False), ("full", False),
                                   ("selective", False), ("none", True), ("none", True)]
    assert treated.policy == "blocks:0,2+selective:1,3+offload:4-5"
    assert BlockTreatments(3, full=(0, 1, 2), offload=(0, 1, 2)).policy == "block+offload"
    assert BlockTreatments(3).policy == "none"


@pytest.mark.parametrize(("policy", "message"), [
    ("block+selective:2", "both fully checkpointed and selective: full recompute"),
    ("blocks:1-2+selective:2-3", r"blocks 2 both"),
    ("none+offload", "unknown checkpoint policy"),
    ("selective:", "unknown checkpoint policy"),
    ("offload:9", "outside 0..5"),
    ("selective:a", "bad checkpoint policy selective:a"),
    ("recompute", "selective"),  # the message lists the grammar
    ("blocks:", "blocks"),
])
def test_bad_policies_say_how_to_write_one(policy, message):
    with pytest.raises(ValueError, match=message):
        parse_treatments(policy, 6)


def test_block_lists_print_as_ranges():
    assert format_blocks((7, 0, 1, 2, 5, 8)) == "0-2,5,7-8"
    assert format_blocks([3]) == "3"


def test_the_spelling_is_checked_before_the_blocks_are_known():
    for policy in ("none", "block", "every:3", "blocks:0-3,70", "selective:5+offload", "plan:40GiB"):
        check_policy_spelling(policy)  # block 70 is checked once the model says how many it has
    with pytest.raises(ValueError, match="names blocks outside 0..3"):
        parse_treatments("blocks:0-3,70", 4)
    for bad, message in (("evry:2", "unknown checkpoint policy"), ("blocks:0-x", "bad checkpoint policy"),
                         ("blocks:0-3+selective:2", "both fully checkpointed and selective")):
        with pytest.raises(ValueError, match=message):
            check_policy_spelling(bad)
