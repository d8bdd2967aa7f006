"""Guarantees, borrowing with the lender's consent, and reclaim preemption.

Fleet of the table cases: two 8-GPU A100 nodes; team cv is guaranteed 8 GPUs, team nlp 8
with a borrow limit of 4 (no GPU left unguaranteed, so every borrowed GPU is some team's).
"""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import timedelta

import pytest
from engine_checks import check_plan, group_key, quota_limits
from engine_factories import (
    make_allocation,
    make_node,
    make_quota,
    make_request,
    make_snapshot,
    random_lending_snapshot,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_pool.engine import plan
from gpu_pool.engine.types import ReasonCode
from gpu_pool.model import MILLI_PER_GPU, Lending, Policy, PriorityClass

A = make_node("a", "A100", 8)
B = make_node("b", "A100", 8)
QUOTAS = (make_quota("cv", 8), make_quota("nlp", 8, borrow=4))
NLP_FULL = (make_allocation("nlp-own", B, tuple(range(8)), team="nlp"),)
BATCH = PriorityClass.BATCH


def _nlp(gpus: int = 4, preemptible: bool = True):
    return make_request("x", gpus, team="nlp", preemptible=preemptible)


# (id, request, lending, allocations, borrowed_from or None, reason code, sentence part)
BORROW_CASES = [
    ("default consent: cv lends its idle guarantee", _nlp(), (), NLP_FULL, "cv", None,
     "borrowed 4 GPUs idle in team cv's quota"),
    ("cv consents to nlp", _nlp(), (Lending("cv", frozenset({"nlp"})),), NLP_FULL, "cv",
     None, "borrowed 4 GPUs idle in team cv's quota"),
    ("cv consents to nobody", _nlp(), (Lending("cv", frozenset()),), NLP_FULL, None,
     ReasonCode.QUOTA_EXHAUSTED,
     "quota: team nlp may borrow only from teams that consent (none do)"),
    ("cv consents to another team only", _nlp(), (Lending("cv", frozenset({"speech"})),),
     NLP_FULL, None, ReasonCode.QUOTA_EXHAUSTED, "only from teams that consent (none do)"),
    ("lend limit below the request", _nlp(4), (Lending("cv", None, limit_gpus=2),), NLP_FULL,
     None, ReasonCode.QUOTA_EXHAUSTED,
     "no lender it may borrow from has 4 GPUs idle to lend (most: 2)"),
    ("lend limit fits the request", _nlp(2), (Lending("cv", None, limit_gpus=2),), NLP_FULL,
     "cv", None, "borrowed 2 GPUs idle in team cv's quota"),
    ("lent already counts against the lend limit", _nlp(2),
     (Lending("cv", None, limit_gpus=2),),
     (*NLP_FULL, make_allocation("lent", A, (0,), team="nlp", preemptible=True,
                                 borrowed_from="cv")),
     None, ReasonCode.QUOTA_EXHAUSTED, "(most: 1)"),
    ("not preemptible: may not borrow", _nlp(preemptible=False), (), NLP_FULL, None,
     ReasonCode.QUOTA_EXHAUSTED,
     "held back: not preemptible, so it may not borrow beyond its guarantee"),
    ("borrow limit reached", _nlp(2), (),
     (*NLP_FULL, make_allocation("lent", A, (0, 1, 2), team="nlp", preemptible=True,
                                 borrowed_from="cv")),
     None, ReasonCode.QUOTA_EXHAUSTED,
     "it borrows 3 of its 4 GPU borrow limit already; needs 2"),
    ("beyond the borrow limit", _nlp(6), (), NLP_FULL, None, ReasonCode.QUOTA_EXHAUSTED,
     "it borrows 0 of its 4 GPU borrow limit already; needs 6"),
    ("preempted as often as a task may be: may not borrow",
     replace(_nlp(), preemptions=2), (), NLP_FULL, None,
     ReasonCode.QUOTA_EXHAUSTED,
     "held back: preempted 2 times already, the most a task may be, so it may not borrow"),
    ("preempted once: may still borrow",
     replace(_nlp(), preemptions=1), (), NLP_FULL, "cv",
     None, "borrowed 4 GPUs idle in team cv's quota"),
]


@pytest.mark.parametrize(("request_", "lending", "allocations", "lender", "code", "sentence"),
                         [c[1:] for c in BORROW_CASES], ids=[c[0] for c in BORROW_CASES])
def test_borrowing(request_, lending, allocations, lender, code, sentence) -> None:
    snap = make_snapshot([A, B], [request_], allocations=allocations, quotas=QUOTAS,
                         lending=lending)
    result = plan(snap)
    check_plan(result, snap)
    placed = result.placement_of("x")
    if lender is None:
        assert placed is None
        reason = result.reason_of("x")
        assert reason.code is code and sentence in reason.message, reason
    else:
        assert placed is not None and placed.borrowed_from == lender
        assert sentence in placed.note
        assert placed.assignments[0].node == "a"


def test_capacity_no_guarantee_covers_is_borrowed_first() -> None:
    c = make_node("c", "A100", 4)  # 4 GPUs beyond all guarantees
    snap = make_snapshot([A, B, c], [_nlp()], allocations=NLP_FULL, quotas=QUOTAS)
    placed = plan(snap).placement_of("x")
    assert placed.borrowed_from == ""
    assert placed.note.startswith("borrowed 4 GPUs no team's guarantee covers")


def test_within_guarantee_nothing_is_borrowed_and_open_fleet_borrows_nothing() -> None:
    snap = make_snapshot([A, B], [_nlp()], quotas=QUOTAS)
    assert plan(snap).placement_of("x").borrowed_from is None
    open_fleet = make_snapshot([A], [_nlp()])
    placed = plan(open_fleet).placement_of("x")
    assert placed.borrowed_from is None and placed.note == ""


def test_borrowing_off_keeps_work_within_guarantees() -> None:
    snap = make_snapshot([A, B], [_nlp()], allocations=NLP_FULL, quotas=QUOTAS,
                         policy=Policy(borrowing=False))
    result = plan(snap)
    assert result.placement_of("x") is None
    assert "borrowing beyond guarantees is off" in result.reason_of("x").message


def _lent(name: str, node, cols, *, priority=BATCH, ran=timedelta(hours=1), **kw):
    return make_allocation(name, node, cols, team="nlp", priority=priority, preemptible=True,
                           borrowed_from=kw.pop("lender", "cv"), ran=ran, **kw)


def _cv(gpus: int = 4, **kw):
    return make_request("x", gpus, team="cv", **kw)


def _reclaim(allocations, request=None, policy=None):
    snap = make_snapshot([A, B], [request or _cv()], allocations=(*NLP_FULL, *allocations),
                         quotas=QUOTAS, policy=policy)
    result = plan(snap)
    check_plan(result, snap)
    return result


# (id, borrowed allocations on node a, names expected preempted)
RECLAIM_CASES = [
    ("lowest priority first",
     [_lent("low", A, (0, 1, 2, 3), priority=PriorityClass.LOW),
      _lent("batch", A, (4, 5, 6, 7))], ["batch"]),
    ("then least work lost",
     [_lent("old", A, (0, 1, 2, 3), ran=timedelta(hours=3)),
      _lent("new", A, (4, 5, 6, 7), ran=timedelta(hours=1))], ["new"]),
    ("victims it does not need are spared",  # s1, s2 lose less work but free too little
     [_lent("s1", A, (0,)), _lent("s2", A, (1,)),
      make_allocation("mine", A, (2, 3), team="nlp"),
      _lent("big", A, (4, 5, 6, 7), ran=timedelta(hours=2))], ["big"]),
    ("preempted before and too young to preempt again",
     [_lent("young", A, tuple(range(8)), ran=timedelta(minutes=5), preemptions=1)], []),
    ("a first preemption needs no minimum runtime",
     [_lent("young", A, tuple(range(8)), ran=timedelta(minutes=1))], ["young"]),
    ("preempted too often",
     [_lent("tired", A, tuple(range(8)), preemptions=2)], []),
    ("its own team's borrowed work is not reclaimed",
     [make_allocation("cv-own-borrow", A, tuple(range(8)), team="cv", priority=BATCH,
                      preemptible=True, borrowed_from="nlp", ran=timedelta(hours=1))], []),
    ("a team over its guarantee gives back work not marked borrowed (Kueue's reclaim)",
     [make_allocation("mine", A, tuple(range(8)), team="nlp", priority=BATCH,
                      preemptible=True)], ["mine"]),
    ("borrowed from this team before another's",
     [_lent("from-nlp", A, (0, 1, 2, 3), lender="speech"),
      _lent("from-cv", A, (4, 5, 6, 7), ran=timedelta(hours=2))], ["from-cv"]),
]


@pytest.mark.parametrize(("allocations", "expected"), [c[1:] for c in RECLAIM_CASES],
                         ids=[c[0] for c in RECLAIM_CASES])
def test_reclaim_choice(allocations, expected) -> None:
    result = _reclaim(allocations)
    assert sorted(p.request_name for p in result.preemptions) == expected
    assert (result.placement_of("x") is not None) == bool(expected)
    for p in result.preemptions:
        assert p.kind == "reclaim" and p.grace_s == 120.0
        assert p.message in (
            "preempted: team cv reclaimed its guarantee, grace 120 s",
            "preempted: team cv reclaimed its guarantee (team nlp holds more than its own "
            "guarantee), grace 120 s")


def test_fewest_victims_across_nodes() -> None:
    c = make_node("c", "A100", 4)
    d = make_node("d", "A100", 4)
    allocs = (*NLP_FULL,
              _lent("one", c, (0, 1, 2, 3)),  # 4 GPU-hours, one victim
              _lent("two-a", d, (0, 1)), _lent("two-b", d, (2, 3)))  # 4 GPU-hours, two
    snap = make_snapshot([A, B, c, d], [_cv(4, models=())],
                         allocations=(*allocs, make_allocation("cv-own", A, tuple(range(8)),
                                                               team="speech")),
                         quotas=(*QUOTAS, make_quota("speech", 0)))
    result = plan(snap)
    check_plan(result, snap)
    assert [p.request_name for p in result.preemptions] == ["one"]
    assert "took back 4 GPUs lent to team nlp (one)" in result.placement_of("x").note


def test_the_excess_cap_is_not_spent_on_a_victim_the_request_does_not_need() -> None:
    """nlp holds 3.2 GPUs beyond its guarantee of 8 (7.7 on node b, 3.5 on node a), none of
    it borrowed. cv needs 4 whole GPUs of node a: its free one and the 3 of w1-w3. nlp's
    share on GPU 0 loses the least work, so it comes first, but freeing it frees no whole
    GPU (cv's own share holds the other half); taking it and w1-w3 would take 3.5 GPUs from
    nlp, more than its 3.2 beyond its guarantee. w1-w3 alone restore cv's guarantee."""
    allocs = (make_allocation("nlp-own", B, tuple(range(7)), team="nlp"),
              make_allocation("nlp-share", B, (7,), milli=700, team="nlp"),
              make_allocation("share", A, (0,), milli=500, team="nlp", priority=BATCH,
                              preemptible=True, ran=timedelta(minutes=30)),
              make_allocation("cv-share", A, (0,), milli=500, team="cv"),
              *(make_allocation(f"w{k}", A, (k,), team="nlp", priority=BATCH,
                                preemptible=True, ran=timedelta(hours=2)) for k in (1, 2, 3)),
              make_allocation("cv-own", A, (5, 6, 7), team="cv"))
    snap = make_snapshot([A, B], [_cv(4)], allocations=allocs, quotas=QUOTAS)
    result = plan(snap)
    check_plan(result, snap)
    assert sorted(p.request_name for p in result.preemptions) == ["w1", "w2", "w3"]
    assert result.placement_of("x").assignments[0].gpu_indices == (1, 2, 3, 4)


def test_work_within_its_teams_guarantee_is_not_reclaimed() -> None:
    """nlp holds 4 + 4 = its guarantee of 8, none of it borrowed: cv, which needs all 8
    GPUs of node a, finds nothing to take back and waits."""
    allocs = (make_allocation("nlp-own", B, (0, 1, 2, 3), team="nlp"),
              make_allocation("mine", A, (0, 1, 2, 3), team="nlp", priority=BATCH,
                              preemptible=True))
    snap = make_snapshot([A, B], [_cv(8)], allocations=allocs, quotas=QUOTAS)
    result = plan(snap)
    check_plan(result, snap)
    assert result.preemptions == ()
    # One more GPU of nlp's beyond its guarantee: still nothing, taking "mine" (4 GPUs)
    # would leave nlp 3 below it.
    extra = make_allocation("extra", B, (4,), team="nlp", priority=BATCH, preemptible=True)
    snap = make_snapshot([A, B], [_cv(8)], allocations=(*allocs, extra), quotas=QUOTAS)
    assert plan(snap).preemptions == ()


def test_work_a_team_starts_this_cycle_counts_in_what_it_holds() -> None:
    """nlp is guaranteed 2 GPUs and holds 2: "old" within its own quota on the only A100,
    "lent" borrowed from speech. Its new request "y" (a T4) starts this cycle within its
    own quota, taking nlp to 3, one beyond its guarantee. cv, holding nothing of its 1,
    waits for the A100: it takes back "old" in this same cycle, not at the next heartbeat
    once "y" shows among the allocations (nlp keeps its 2: "lent" and "y")."""
    a, b, c = make_node("a", "A100", 1), make_node("b", "T4", 1), make_node("c", "T4", 1)
    quotas = (make_quota("cv", 1), make_quota("nlp", 2), make_quota("speech", 1))
    allocs = (make_allocation("old", a, (0,), team="nlp", priority=BATCH, preemptible=True,
                              ran=timedelta(hours=2)),
              make_allocation("lent", c, (0,), team="nlp", preemptible=True,
                              borrowed_from="speech"))
    x = make_request("x", team="cv", models=("A100",))
    y = make_request("y", team="nlp", models=("T4",))
    snap = make_snapshot([a, b, c], [x, y], allocations=allocs, quotas=quotas)
    result = plan(snap)
    check_plan(result, snap)
    assert result.placement_of("y").assignments[0].node == "b"
    assert [p.request_name for p in result.preemptions] == ["old"]
    assert result.placement_of("x").note == (
        "reclaimed its guarantee: took back 1 GPUs held beyond their guarantee by team nlp "
        "(old)")
    # Without "y", nlp holds exactly its guarantee: nothing to take back.
    alone = make_snapshot([a, b, c], [x], allocations=allocs, quotas=quotas)
    assert plan(alone).preemptions == ()


def test_a_gang_is_preempted_whole_or_not_at_all() -> None:
    c = make_node("c", "A100", 4)

    def run(gang_ran: timedelta):
        allocs = (*NLP_FULL, _lent("gang", A, (0, 1, 2, 3), preemptions=1),
                  _lent("gang", c, (0, 1), ran=gang_ran, preemptions=1),
                  _lent("other", A, (4, 5, 6, 7), priority=PriorityClass.LOW),
                  make_allocation("fill", c, (2, 3), team="cv"))
        snap = make_snapshot([A, B, c], [_cv()], allocations=allocs, quotas=QUOTAS)
        result = plan(snap)
        check_plan(result, snap)
        return [(p.request_name, p.allocation_id) for p in result.preemptions]

    assert run(timedelta(hours=1)) == [("gang", "alloc-gang-a"), ("gang", "alloc-gang-c")]
    assert run(timedelta(minutes=1)) == [("other", "alloc-other-a")]


def test_grace_is_the_tasks_own_when_set_and_reclaim_can_be_off() -> None:
    result = _reclaim([_lent("own", A, tuple(range(8)), grace=timedelta(seconds=30))])
    assert result.preemptions[0].grace_s == 30.0
    assert result.preemptions[0].message.endswith("grace 30 s")
    off = _reclaim([_lent("own", A, tuple(range(8)))],
                   policy=Policy(reclaim_guarantees=False))
    assert off.preemptions == () and off.placement_of("x") is None


def test_beyond_its_guarantee_a_team_does_not_reclaim() -> None:
    result = _reclaim([_lent("lent", A, tuple(range(8)))], request=_cv(9, models=()))
    assert result.preemptions == ()


def test_critical_preemption_keeps_the_same_rules() -> None:
    crit = make_request("x", 4, team="cv", priority=PriorityClass.CRITICAL)
    young = _lent("young", A, tuple(range(8)), ran=timedelta(minutes=1), preemptions=1)
    assert _reclaim([young], request=crit).preemptions == ()
    result = _reclaim([make_allocation("b1", A, tuple(range(8)), team="speech",
                                       priority=BATCH, preemptible=True)], request=crit)
    assert [(p.request_name, p.kind, p.grace_s) for p in result.preemptions] == [
        ("b1", "critical", 120.0)]


def _restorable(result, snap) -> list[str]:
    """Pending single-node requests within their team's guarantee that would fit on one
    node if every eligible borrowed victim still running there were preempted."""
    limits = quota_limits(snap)
    gone = {p.allocation_id for p in result.preemptions}
    used: dict = {}
    for a in snap.allocations:
        key = group_key(limits, a.team, a.purpose, a.gpu_model)
        if key and a.borrowed_from is None:
            used[key] = used.get(key, 0) + a.gpu_milli_total
    reqs = {r.name: r for r in snap.requests}
    free = {n.name: n.gpu_count for n in snap.nodes}
    for a in snap.allocations:
        if a.id not in gone:
            free[a.node] -= len(a.gpu_indices)
    for p in result.placements:
        r = reqs[p.request_name]
        for x in p.assignments:
            free[x.node] -= r.gpus
            key = group_key(limits, r.team, r.purpose, "A100")
            if key and p.borrowed_from is None:
                used[key] = used.get(key, 0) + r.gpus * MILLI_PER_GPU
    policy = snap.policy
    by_request: dict = {}
    for a in snap.allocations:
        by_request.setdefault(a.request_name, []).append(a)
    out = []
    for pending in result.pending:
        r = reqs[pending.request_name]
        key = group_key(limits, r.team, r.purpose, "A100")
        if r.is_gang or key is None or used.get(key, 0) + r.total_gpu_milli > limits[key]:
            continue
        for node in snap.nodes:
            gain = 0
            for parts in by_request.values():
                if any(a.id in gone for a in parts):
                    continue
                if all(a.borrowed_from is not None and a.team != r.team and a.preemptible
                       and a.priority is not PriorityClass.CRITICAL
                       and (a.preemptions == 0
                            or snap.now - a.started_at >= policy.min_runtime_before_preemption)
                       and a.preemptions < policy.max_preemptions_per_task for a in parts):
                    gain += sum(len(a.gpu_indices) for a in parts if a.node == node.name)
            if free[node.name] + gain >= r.gpus and gain > 0:
                out.append(r.name)
                break
    return out


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), nodes=st.integers(1, 5), requests=st.integers(1, 12))
def test_lending_properties(seed: int, nodes: int, requests: int) -> None:
    """Never a non-preemptible or critical victim; borrowing within consent and limits (the
    checker); no team left below its guarantee when preempting borrowed work would restore
    it; the same plan for the same snapshot."""
    snap = random_lending_snapshot(random.Random(seed), nodes=nodes, requests=requests)
    result = plan(snap)
    check_plan(result, snap)
    if snap.policy.reclaim_guarantees:
        assert _restorable(result, snap) == []
    again = plan(snap)
    assert again.placements == result.placements and again.preemptions == result.preemptions
    assert again.pending == result.pending


def test_the_checker_refuses_borrowing_and_preemption_that_break_the_rules() -> None:
    import dataclasses

    snap = make_snapshot([A, B], [_nlp(preemptible=False)], allocations=NLP_FULL,
                         quotas=QUOTAS, lending=(Lending("cv", frozenset()),))
    good = plan(snap)
    assert good.placement_of("x") is None
    from gpu_pool.engine.types import NodeAssignment, Placement, Preemption

    forged = Placement("x", (NodeAssignment("a", (0, 1, 2, 3), 1000, 0, 0),),
                       borrowed_from="cv", note="borrowed 4 GPUs idle in team cv's quota")
    with pytest.raises(AssertionError, match="not preemptible"):
        check_plan(dataclasses.replace(good, placements=(forged,), pending=()), snap)
    again = _lent("young", A, tuple(range(8)), ran=timedelta(minutes=1), preemptions=1)
    reclaim = _reclaim([again])
    young = make_snapshot([A, B], [_cv()], quotas=QUOTAS, allocations=(*NLP_FULL, again))
    bad = dataclasses.replace(reclaim, preemptions=(Preemption(
        "alloc-young-a", "young", "x", "preempted", 120.0, "reclaim"),))
    with pytest.raises(AssertionError, match="too young"):
        check_plan(bad, young)


def test_critical_work_frees_its_own_teams_quota_from_lower_priority_preemptible_work() -> None:
    """Kueue's within-queue preemption: nlp's guarantee (8) is full of its own batch work;
    a critical nlp request takes its quota and GPUs back from it, never from nlp's
    non-preemptible work, and cv's idle GPUs stay cv's (nlp may not borrow them for
    non-preemptible work)."""
    own = (make_allocation("nlp-batch", B, (0, 1, 2, 3), team="nlp", priority=BATCH,
                           preemptible=True, ran=timedelta(hours=1)),
           make_allocation("nlp-prod", B, (4, 5, 6, 7), team="nlp", ran=timedelta(hours=1)))
    urgent = make_request("x", 4, team="nlp", priority=PriorityClass.CRITICAL)
    snap = make_snapshot([A, B], [urgent], allocations=own, quotas=QUOTAS)
    result = plan(snap)
    check_plan(result, snap)
    (pre,) = result.preemptions
    assert pre.request_name == "nlp-batch" and pre.kind == "critical"
    assert "within team nlp's quota" in pre.message
    assert result.placement_of("x").assignments[0].node == "b"
    # Only non-preemptible work in the quota: nothing to take; critical work borrows cv's
    # idle GPUs (never reclaimed), or with critical_borrows off waits for its quota.
    prod = (make_allocation("nlp-prod", B, tuple(range(8)), team="nlp", ran=timedelta(hours=1)),)
    snap = make_snapshot([A, B], [urgent], allocations=prod, quotas=QUOTAS)
    result = plan(snap)
    check_plan(result, snap)
    placed = result.placement_of("x")
    assert result.preemptions == () and placed.borrowed_from == "cv"
    assert placed.note == ("borrowed 4 GPUs idle in team cv's quota; critical work, not "
                           "reclaimed: its lender waits for it to end")
    snap = make_snapshot([A, B], [urgent], allocations=prod, quotas=QUOTAS,
                         policy=Policy(critical_borrows=False))
    result = plan(snap)
    assert result.preemptions == () and result.placement_of("x") is None
    assert result.reason_of("x").code is ReasonCode.QUOTA_EXHAUSTED


# Critical work beyond its quota with nothing idle (Kueue's borrowWithinCohort): nlp's
# guarantee is full of its own non-preemptible work on b; on a, cv runs 4 GPUs of its own
# and lends the other 4 to team speech (guaranteed 0, may borrow 8).
SPEECH_QUOTAS = (*QUOTAS, make_quota("speech", 0, borrow=8))
NLP_PROD = make_allocation("nlp-prod", B, tuple(range(8)), team="nlp")
CV_OWN = make_allocation("cv-own", A, (0, 1, 2, 3), team="cv")
SPEECH_LENT = make_allocation("speech-lent", A, (4, 5, 6, 7), team="speech",
                              priority=PriorityClass.LOW, preemptible=True,
                              borrowed_from="cv")
URGENT = make_request("x", 2, team="nlp", priority=PriorityClass.CRITICAL,
                      waited=timedelta(minutes=2))
ON = Policy()

# (id, allocations, lending, policy, victim or None)
CRITICAL_BORROW_CASES = [
    ("preempts the borrower and borrows from its lender",
     (NLP_PROD, CV_OWN, SPEECH_LENT), (), ON, "speech-lent"),
    ("off: waits", (NLP_PROD, CV_OWN, SPEECH_LENT), (),
     Policy(critical_preempts_borrowers=False), None),
    ("critical borrowing off: waits", (NLP_PROD, CV_OWN, SPEECH_LENT), (),
     replace(ON, critical_borrows=False), None),
    ("borrowing off: waits", (NLP_PROD, CV_OWN, SPEECH_LENT), (),
     replace(ON, borrowing=False), None),
    ("the lender lends to speech only: nothing preempted for nothing",
     (NLP_PROD, CV_OWN, SPEECH_LENT), (Lending("cv", frozenset({"speech"})),), ON, None),
    ("work within its own team's guarantee is never taken",
     (NLP_PROD, CV_OWN, replace(SPEECH_LENT, team="cv", borrowed_from=None)), (), ON, None),
    ("a non-preemptible borrower is never taken",
     (NLP_PROD, CV_OWN, replace(SPEECH_LENT, preemptible=False)), (), ON, None),
    ("speech over its guarantee without the borrowed mark: its excess is taken",
     (NLP_PROD, CV_OWN, replace(SPEECH_LENT, borrowed_from=None)), (), ON, "speech-lent"),
    ("a victim preempted twice already is never taken",
     (NLP_PROD, CV_OWN, replace(SPEECH_LENT, preemptions=2)), (), ON, None),
]


@pytest.mark.parametrize(("allocations", "lending", "policy", "victim"),
                         [c[1:] for c in CRITICAL_BORROW_CASES],
                         ids=[c[0] for c in CRITICAL_BORROW_CASES])
def test_critical_work_beyond_its_quota_preempts_other_teams_borrowers(
        allocations, lending, policy, victim):
    snap = make_snapshot([A, B], [URGENT], allocations=allocations, quotas=SPEECH_QUOTAS,
                         lending=lending, policy=policy)
    result = plan(snap)
    check_plan(result, snap)
    placed = result.placement_of("x")
    if victim is None:
        assert result.preemptions == () and placed is None
        return
    (pre,) = result.preemptions
    assert (pre.request_name, pre.kind, pre.grace_s) == (victim, "critical", 120.0)
    assert pre.message == ("preempted for critical request x: team nlp's guarantee is used "
                           "up, so it borrows, and nothing else fits; team speech holds this "
                           "beyond its own guarantee, grace 120 s")
    assert placed.borrowed_from == "cv" and placed.assignments[0].node == "a"
    assert placed.note == ("borrowed 2 GPUs of team cv's quota, preempting team speech "
                           f"({victim}) (held beyond their guarantees); critical work, not "
                           "reclaimed")


def test_critical_work_beyond_its_quota_preempts_once_it_has_waited_the_grace():
    """The ski-rental rule: before it has waited its victims' grace (their own, else the
    policy's) an end may start it as soon as preempting would; from then on it preempts."""
    for waited, grace, preempts in [(119, None, False), (120, None, True),
                                    (299, 300, False), (300, 300, True), (60, 30, True)]:
        lent = replace(SPEECH_LENT, grace=None if grace is None else timedelta(seconds=grace))
        urgent = replace(URGENT, submitted_at=URGENT.submitted_at + timedelta(minutes=2)
                         - timedelta(seconds=waited))
        snap = make_snapshot([A, B], [urgent], allocations=(NLP_PROD, CV_OWN, lent),
                             quotas=SPEECH_QUOTAS)
        result = plan(snap)
        check_plan(result, snap)
        assert bool(result.preemptions) is preempts, (waited, grace)
        assert (result.placement_of("x") is not None) is preempts
        if not preempts:
            at = urgent.submitted_at + timedelta(seconds=grace or 120)
            assert result.estimates["x"] == at + timedelta(seconds=grace or 120)
            assert result.reason_of("x").message.endswith(
                f"; unless GPUs free first, it preempts work other teams hold beyond their "
                f"guarantees at {at:%Y-%m-%d %H:%M:%S} UTC, once it has waited their "
                f"{grace or 120} s grace")


def test_critical_work_beyond_its_quota_borrows_idle_gpus_before_preempting():
    """One GPU of the borrower's four ended: a 1-GPU critical request borrows it, and a
    2-GPU one preempts (the idle one alone does not hold it)."""
    lent = replace(SPEECH_LENT, gpu_indices=(5, 6, 7))
    one = replace(URGENT, gpus=1)
    snap = make_snapshot([A, B], [one], allocations=(NLP_PROD, CV_OWN, lent),
                         quotas=SPEECH_QUOTAS, policy=ON)
    result = plan(snap)
    check_plan(result, snap)
    assert result.preemptions == () and result.placement_of("x").borrowed_from == "cv"
    snap = make_snapshot([A, B], [URGENT], allocations=(NLP_PROD, CV_OWN, lent),
                         quotas=SPEECH_QUOTAS, policy=ON)
    result = plan(snap)
    check_plan(result, snap)
    assert [p.request_name for p in result.preemptions] == ["speech-lent"]
    assert result.placement_of("x").borrowed_from == "cv"
