"""A resource wait that expires says what is missing: what is needed against what the nodes
have, and, when placement groups already reserve it, whose they are and what is free now."""

from actors.placement_wait import TARGET_GROUP_PREFIX, missing

NODE = [{"Alive": True, "Resources": {"CPU": 2.0, "memory": 8e9}}]
TARGET_TP2 = {"pg1": {"name": f"{TARGET_GROUP_PREFIX}-1a2b3c4d-pg", "state": "CREATED", "strategy": "STRICT_PACK",
                      "bundles": {0: {"CPU": 1.0}, 1: {"CPU": 1.0}}}}


def test_a_draft_that_waits_behind_the_target_group_of_tp_2_says_the_group_took_the_cpus():
    line = missing([{"CPU": 1.0}], "PACK", nodes=NODE, groups=TARGET_TP2, free={})
    assert line == ("needs 1 x {'CPU': 1.0} = {'CPU': 1.0} in the cluster; 1 node(s) have [{'CPU': 2.0}], of which "
                    "the target's group reserves 2 x {'CPU': 1.0} = {'CPU': 2.0}; free now: {'CPU': 0.0}")


def test_other_groups_are_named_and_removed_or_pending_ones_and_other_resources_are_left_out():
    groups = {**TARGET_TP2,
              "pg2": {"name": "", "state": "CREATED", "bundles": {0: {"CPU": 0.5}}},
              "pg3": {"name": "batch-jobs", "state": "REMOVED", "bundles": {0: {"CPU": 2.0}}},
              "pg4": {"name": "gpus", "state": "CREATED", "bundles": {0: {"GPU": 1.0}}}}
    line = missing([{"CPU": 1.0}], "PACK", nodes=NODE, groups=groups, free={"CPU": 0.5})
    assert "the target's group reserves 2 x {'CPU': 1.0}" in line
    assert "placement group (unnamed) reserves 1 x {'CPU': 0.5}" in line
    assert "batch-jobs" not in line and "gpus" not in line and line.endswith("free now: {'CPU': 0.5}")


def test_without_reservations_it_says_only_what_is_needed_and_had():
    line = missing([{"CPU": 64.0}] * 2, "STRICT_PACK", nodes=NODE, groups={}, free={"CPU": 2.0})
    assert line == "needs 2 x {'CPU': 64.0} = {'CPU': 128.0} on one node; 1 node(s) have [{'CPU': 2.0}]"
