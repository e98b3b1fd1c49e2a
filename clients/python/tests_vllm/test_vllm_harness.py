"""vLLM's own offloading-connector harness, run against kvtier's spec.

vLLM 0.33's ``tests/v1/kv_connector/unit/offloading_connector/`` (from the
sdist on the package index; ``scripts/vllm-harness.sh`` fetches and caches
it, nothing of it is in this repository) drives a real vLLM ``Scheduler``
and a worker-side ``OffloadingConnector`` through ``RequestRunner`` (its
``utils.py``). This file is two things:

1. **A pytest plugin** (``-p test_vllm_harness``) for vLLM's test files, run
   unmodified. Every ``RequestRunner`` vLLM's ``request_runner`` fixture
   builds loads kvtier's spec the way an engine does, through the seam
   RequestRunner has for it (``extra_config_overrides``, merged over its
   ``spec_name: MockOffloadingSpec`` default)::

       spec_name: KvtierOffloadingSpec, spec_module_path: kvtier_vllm,
       kvtier_address: <a kvtierd started for the test>

   so the scheduler side runs kvtier's real manager against a live kvtierd,
   and the worker side kvtier's real worker (its CPU copy path: the runner's
   KV caches are host tensors) over kvtierd's shared-memory pool.

   RequestRunner was written for its ``MockOffloadingSpec``; what it reads of
   that mock is given to it over kvtier's objects (``_KvtierHarness``):

   - the manager is a ``MagicMock`` spy over kvtier's manager (RequestRunner
     asserts a MagicMock). Every call goes to kvtier's manager. Where a test
     dictates an answer (``runner.manager.prepare_store.side_effect = ...``)
     the test's answer is worked out too and must equal kvtier's -- or be
     kvtier's documented one-step RETRY for a HIT -- else the call raises
     ``KvtierAnswerDiffers``. vLLM always gets kvtier's answer;
   - the worker is wrapped in a recorder with the mock worker's bookkeeping
     (jobs submitted, completed, waited on; a job's completion is reported
     when the runner completes transfers, as with the mock);
   - a transfer's offloaded address is kvtier's (pool, slot), so the runner's
     own check -- a block is loaded from where that block was stored -- checks
     kvtier's slots;
   - each RequestRunner gets its own kvtier namespace (each is an engine with
     an offload tier of its own, as with its mock);
   - RequestRunner has no forward pass, so a step takes microseconds where an
     engine's takes milliseconds: after each step the manager settles (the
     replies kvtierd sends during a forward pass are in before the next step).
     ``KVTIER_HARNESS_STEP_TIME=0`` turns that off;
   - RequestRunner's KV caches (one ``torch.empty`` per layer) overlay one
     allocation where its KVCacheConfig says they do (``_OverlaidTorch``).

   Every test that cannot apply is deselected, with its reason, by
   ``NOT_APPLICABLE`` (the one place): a file key gives the reason for that
   file's tests that build no RequestRunner; every RequestRunner test has
   an entry of its own, ``None`` where it runs against kvtier. The run
   fails on a stale key or on a RequestRunner test without an entry.

2. **kvtier scenarios on vLLM's RequestRunner** (the tests at the end): a
   store, the GPU prefix cache dropped, the same prompt again: the blocks
   come back from kvtier -- checked byte for byte, which vLLM's harness does
   not check (its mock worker copies nothing).

Run: ``bash scripts/vllm-harness.sh`` (fetches the sdist, builds kvtierd,
runs both in the vLLM 0.33 venv, prints the pass/skip/fail/deselected list).
Collected without vLLM 0.33's test tree on ``sys.path`` (vLLM 0.32's CPU
venv, scripts/test.sh) the scenarios skip, saying why.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import os
import subprocess
from typing import Any, Dict, List, Optional

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
VLLM_VERSION = "0.33.0"
HARNESS_DIR = "tests/v1/kv_connector/unit/offloading_connector"
UTILS = "tests.v1.kv_connector.unit.offloading_connector.utils"

# -- what cannot apply -------------------------------------------------------------
#
# Keys are test ids relative to vLLM's offloading_connector/ directory: a file
# ("test_config.py"), a class ("test_scheduler.py::TestEagle"), a test
# ("test_scheduler.py::TestEagle::test_x", every parametrization) or one
# parametrization ("...::test_x[True]"); the most specific key wins. A value
# of None: the test runs, against kvtier.

_NOT_A_RUNNER = (
    "builds no RequestRunner and loads no spec through spec_module_path: it tests "
    "{what} directly, so there is no seam to put kvtier's spec in without "
    "rewriting the test")
_REFUSE = (
    "dictates that the manager refuse a store (prepare_store -> None, an allocation "
    "failure); kvtier's manager, with free slots, stores")
_STORE_NONE = (
    "dictates that the manager store none or only some of a request's new chunks "
    "(prepare_store -> generate_store_output([]) or a subset); kvtier's manager "
    "stores every new chunk it has room for")
_RESTORE = (
    "dictates storing again chunks the test itself stored before (the mock keeps no "
    "state); kvtier's manager, which holds them, has nothing to store -- or, while "
    "their commit is still landing in kvtierd's index, stores them again and kvtierd "
    "settles the duplicate: which of the two is timing")
_MOCK_FORGETS = (
    "expects the same prompt to be computed and stored again, as the mock's default "
    "lookup (MISS) forgets what the test stored; kvtier holds those chunks and "
    "serves them (a load), so RequestRunner.run's store/load sets differ "
    "(KeyError / AssertionError in utils.py run)")
_LOOKUP = (
    "dictates lookup answers (HIT, RETRY) for keys kvtier was never given (synthetic "
    "keys, or blocks never stored): kvtier's manager answers MISS")
_EVENTS = (
    "dictates the manager's KV events (take_events); kvtier's manager publishes none "
    "(kvtierd publishes the CPU and storage media itself), so the events the test "
    "expects never come")
_POLICY = (
    "dictates OffloadPolicy.REQUEST_LEVEL from on_new_request; kvtier's manager "
    "offloads chunk by chunk (vLLM's default, OffloadPolicy.CHUNK_LEVEL)")
_FORCED_HIT = (
    "forces hits by replacing connector_scheduler._maximal_prefix_lookup, so the "
    "connector calls prepare_load without the HIT lookup that takes kvtier's lease; "
    "kvtier's manager then pins synchronously, and kvtierd refuses (UNKNOWN_KEY) "
    "a key it does not hold. vLLM's scheduler never loads without a HIT lookup. "
    "(Forced loads of keys whose store was just completed pass since kvtierd keeps "
    "calls in arrival order around its commits: scheduler/order.go)")
_PAGE_SIZES = (
    "KV cache groups of different page sizes: RequestRunner hands the worker one "
    "tensor per group while its KVCacheConfig overlays the groups in one allocation "
    "(vLLM plans worker_kv_bytes_per_block = the largest page); groups of one page "
    "size are overlaid here as an engine does (_OverlaidTorch), these cannot be (no "
    "common block stride). kvtier's worker sizes a chunk's slot as the sum of the "
    "pages of every tensor it is handed and refuses at register_kv_caches "
    "(KvtierConfigError: 'this worker's KV pages take N bytes per chunk, more than "
    "the M the scheduler planned slots for')")
_CPU_MANAGER = (
    "replaces the runner's manager with vLLM's own CPUOffloadingManager "
    "(sched.manager = CPUOffloadingManager(...)): kvtier's manager is not the one "
    "answering")

NOT_APPLICABLE: Dict[str, Optional[str]] = {
    # -- files: their tests build no RequestRunner ------------------------------
    "test_canonical_mapping.py": _NOT_A_RUNNER.format(
        what="vLLM's canonical page mapping, over hand-built KV cache specs"),
    "test_config.py": _NOT_A_RUNNER.format(
        what="vLLM's OffloadingConfig derivation (MockOffloadingSpec, TieringOffloadingSpec)"),
    "test_events.py": _NOT_A_RUNNER.format(
        what="vLLM's KV-event tracker (CPUOffloadingManager, TieringOffloadingSpec)"),
    "test_metrics.py": _NOT_A_RUNNER.format(
        what="vLLM's connector metrics and stats aggregation, on hand-built payloads"),
    "test_scheduler.py": _NOT_A_RUNNER.format(
        what="vLLM's OffloadingConnectorScheduler over MockOffloadingSpec, a "
             "SimpleNamespace spec or CPUOffloadingManager, or its pure helpers"),
    "test_worker.py": _NOT_A_RUNNER.format(
        what="vLLM's OffloadingConnectorWorker, over mock workers and bare specs"),
    "test_worker_metadata.py": _NOT_A_RUNNER.format(
        what="vLLM's OffloadingWorkerMetadata aggregation"),

    # -- RequestRunner tests that run against kvtier ----------------------------
    "test_metrics.py::test_scheduler_sends_the_config_info_once": None,
    "test_scheduler.py::test_abort_queued_request_does_not_build_store_job": None,
    "test_scheduler.py::test_complete_store_called_per_job": None,
    "test_scheduler.py::test_complete_store_waits_for_all_worker_acks": None,
    "test_scheduler.py::test_final_sampled_token_does_not_complete_an_offloaded_block": None,
    "test_scheduler.py::test_has_pending_push_work_does_not_open_the_step_region": None,
    "test_scheduler.py::test_max_offload_tokens_validation": None,
    "test_scheduler.py::test_offload_prompt_only": None,
    "test_scheduler.py::test_on_request_finished_not_deferred_until_store_completion": None,
    "test_scheduler.py::test_reset_cache_finalizes_finished_request_with_pending_store": None,
    "test_scheduler.py::test_streaming_session_stores_new_chunks": None,
    "test_scheduler.py::test_take_events_drains_the_manager_inside_the_region": None,
    "test_scheduler.py::test_two_groups_full_and_sliding_window": None,
    "test_scheduler.py::TestEagle::test_full_attn_lookup_no_hits_returns_zero": None,
    "test_scheduler.py::TestEagle::test_multichunk_store_no_interior_holes": None,
    "test_scheduler.py::TestEagle::test_single_block_stored_at_end_of_prefill": None,
    "test_scheduler.py::TestEagle::test_sw_store_excludes_trailing_decode_block": None,
    "test_scheduler.py::TestSharedGroupMTPOffload::test_no_annotation_marks_no_groups": None,
    "test_scheduler.py::test_abort_loading_requests": None,  # forced hits of keys just stored (scheduler/order.go)
    "test_scheduler.py::test_async_preempt_readmit_before_transfer_output_is_deferred": None,  # forced hits of keys just stored (scheduler/order.go)
    "test_scheduler.py::test_concurrent_lookups_of_the_same_prefix": None,  # forced hits of keys just stored (scheduler/order.go)
    "test_scheduler.py::test_prefix_cache_reset_preserves_same_step_offload_reload": None,  # forced hits of keys just stored (scheduler/order.go)
    "test_scheduler.py::test_reset_cache": None,  # forced hits of keys just stored (scheduler/order.go)

    # -- RequestRunner tests that cannot apply ----------------------------------
    "test_scheduler.py::test_abort_before_hit_uses_placeholder_then_later_hit_heals_removal":
        _LOOKUP,
    "test_scheduler.py::test_external_cache_hit_sources_reconcile_different_group_chunk_sizes":
        _PAGE_SIZES + "; it also dictates get_load_source",
    "test_scheduler.py::test_fence_at_build_store_jobs": _STORE_NONE,
    "test_scheduler.py::test_fence_at_update_state_after_alloc":
        _FORCED_HIT + " (here refused every run: the forced load names a block kvtierd does not hold)",
    "test_scheduler.py::test_loads_do_not_populate_fence_index":
        _FORCED_HIT + " (here a key never stored: refused every run)",
    "test_scheduler.py::test_max_load_tokens_limits_external_load": _RESTORE,
    "test_scheduler.py::test_max_offload_tokens_zero_does_not_record_pending_lookups": _LOOKUP,
    "test_scheduler.py::test_multiple_in_flight_stores_all_flushed_by_fence": _MOCK_FORGETS,
    "test_scheduler.py::test_offloading_connector": _STORE_NONE + "; it also " + _FORCED_HIT,
    "test_scheduler.py::test_on_request_finished_fires_after_final_block_store": _REFUSE,
    "test_scheduler.py::test_on_schedule_end_is_the_last_manager_call_of_a_step": _STORE_NONE,
    "test_scheduler.py::test_promotion_hit_precedes_stored_event_translation": _EVENTS,
    "test_scheduler.py::test_request_finished_mixed_full_attn_and_sliding_window": _RESTORE,
    "test_scheduler.py::test_request_finished_with_pending_stores_populates_fence": _MOCK_FORGETS,
    "test_scheduler.py::test_request_level_policy_stores_all_blocks": _POLICY,
    "test_scheduler.py::test_request_level_supply_covers_consumer_demand":
        _POLICY + "; its eagle cases also: " + _PAGE_SIZES,
    "test_scheduler.py::test_request_preemption":
        "cpu_hit=True: " + _FORCED_HIT + ". cpu_hit=False: " + _MOCK_FORGETS,
    "test_scheduler.py::test_retention_interval_sparsifies_swa_stores": _PAGE_SIZES,
    "test_scheduler.py::test_retention_interval_zero_stores_only_replay_boundary": _PAGE_SIZES,
    "test_scheduler.py::test_scheduler_reports_allocation_failure": _REFUSE,
    "test_scheduler.py::test_scheduler_reports_lookup_async_delay_on_resolve": _LOOKUP,
    "test_scheduler.py::test_scheduler_reports_lookup_sync_delay": _STORE_NONE,
    "test_scheduler.py::test_skip_reading_prefix_cache": _RESTORE,
    "test_scheduler.py::test_sliding_window_chunk_with_null_block_is_not_stored": _STORE_NONE,
    "test_scheduler.py::test_small_hit_loads_synchronously": _STORE_NONE + "; it also " + _FORCED_HIT,
    "test_scheduler.py::test_stale_sliding_window_block_after_prepare_store_failure": _REFUSE,
    "test_scheduler.py::test_step_releases_the_manager_before_the_model_runs": _STORE_NONE,
    "test_scheduler.py::test_store_jobs_wait_for_missing_offload_key": _REFUSE,
    "test_scheduler.py::test_swa_alignment_skip": _PAGE_SIZES,
    "test_scheduler.py::test_swa_load_does_not_wait_for_unusable_pending_suffix": _CPU_MANAGER,
    "test_scheduler.py::test_two_groups_different_block_sizes": _PAGE_SIZES,
    "test_scheduler.py::TestEagle::test_active_decode_does_not_advance_swa_final_horizon":
        _PAGE_SIZES,
    "test_scheduler.py::TestEagle::test_chunked_prefill_uses_final_swa_store_horizon": _PAGE_SIZES,
    "test_scheduler.py::TestEagle::test_eagle_verified_prevents_double_pop": _PAGE_SIZES,
    "test_scheduler.py::TestEagle::test_full_attn_lookup_pops_one_block": _LOOKUP,
    "test_scheduler.py::TestEagle::test_full_attn_lookup_single_block_returns_zero": _LOOKUP,
    "test_scheduler.py::TestEagle::test_full_attn_store_excludes_trailing_decode_block":
        _PAGE_SIZES,
    "test_scheduler.py::TestEagle::test_full_attn_store_then_load": _PAGE_SIZES,
    "test_scheduler.py::TestEagle::test_non_eagle_tighten_clears_eagle_verified": _PAGE_SIZES,
    "test_scheduler.py::TestEagle::test_sw_lookup_inflates_query_max": _LOOKUP,
    "test_scheduler.py::TestEagle::test_sw_lookup_requires_extra_window_block": _LOOKUP,
    "test_scheduler.py::TestEagle::test_sw_lookup_w_plus_one_hits_returns_w_blocks": _LOOKUP,
}


def _entry(relid: str) -> Optional[str]:
    """The most specific NOT_APPLICABLE key covering a test id (relative to
    vLLM's offloading_connector/ directory), or None."""
    base = relid.split("[", 1)[0]
    parts = base.split("::")
    for key in [relid] + ["::".join(parts[:n]) for n in range(len(parts), 0, -1)]:
        if key in NOT_APPLICABLE:
            return key
    return None


# -- the plugin --------------------------------------------------------------------


def _harness_relid(item) -> Optional[str]:
    path = str(item.path).replace(os.sep, "/")
    if (HARNESS_DIR + "/") not in path:
        return None
    return os.path.basename(path) + "::" + item.nodeid.split("::", 1)[1]


def pytest_configure(config):
    config._kvtier_deselected = []
    config.addinivalue_line("markers", "skip_global_cleanup: vLLM's marker")
    config.addinivalue_line("markers", "cpu_test: vLLM's marker")


def pytest_collection_modifyitems(session, config, items):
    keep, drop, used, errors = [], [], set(), []
    collected_files = {}
    for item in items:
        relid = _harness_relid(item)
        if relid is None:
            keep.append(item)
            continue
        collected_files[relid.split("::", 1)[0]] = os.path.dirname(str(item.path))
        key = _entry(relid)
        runner = "request_runner" in getattr(item, "fixturenames", ())
        if key is not None:
            used.add(key)
        if runner and (key is None or "::" not in key):
            errors.append(f"{relid}: a RequestRunner test without an entry of its own")
        if key is None or NOT_APPLICABLE[key] is None:
            keep.append(item)
        else:
            drop.append(item)
            config._kvtier_deselected.append((relid, key, NOT_APPLICABLE[key]))
    if collected_files:
        where = next(iter(collected_files.values()))
        for key in sorted(set(NOT_APPLICABLE) - used):
            f = key.split("::", 1)[0]
            if f in collected_files or not os.path.exists(os.path.join(where, f)):
                errors.append(f"{key}: stale (no such test in vLLM's files)")
    if errors:
        raise pytest.UsageError("NOT_APPLICABLE (test_vllm_harness.py) is out of date:\n  "
                                + "\n  ".join(errors))
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    dropped = getattr(config, "_kvtier_deselected", [])
    if not dropped:
        return
    tr = terminalreporter
    tr.section("vLLM tests that cannot apply to kvtier's spec (deselected, NOT_APPLICABLE)")
    by_key: Dict[str, List[str]] = {}
    for relid, key, _ in dropped:
        by_key.setdefault(key, []).append(relid)
    for key, ids in sorted(by_key.items()):
        tr.write_line(f"DESELECTED {key} ({len(ids)} test(s)): {NOT_APPLICABLE[key]}")
    tr.write_line(f"{len(dropped)} deselected in all")


# -- kvtierd -----------------------------------------------------------------------


def _daemon_class():
    """The suites' Daemon (testsupport/kvtierd.py), loaded from its file
    under a private name: run inside vLLM's tree, this tree is not on
    sys.path (and vLLM has conftest modules of its own)."""
    spec = importlib.util.spec_from_file_location("kvtier_testsupport_kvtierd",
                                                  os.path.join(HERE, "..", "testsupport", "kvtierd.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.Daemon


@pytest.fixture(scope="session")
def kvtier_harness_bin(tmp_path_factory):
    prebuilt = os.environ.get("KVTIER_HARNESS_KVTIERD")
    if prebuilt:
        return prebuilt
    out = str(tmp_path_factory.mktemp("bin") / "kvtierd")
    subprocess.run(["go", "build", "-o", out, "./cmd/kvtierd"], cwd=REPO, check=True)
    return out


SLOT_BYTES = 4096   # a slot: more than any chunk these tests offload
POOL_BYTES = 4 << 20  # 1024 slots


@pytest.fixture
def kvtier_harness_daemon(kvtier_harness_bin, tmp_path):
    d = _daemon_class()(kvtier_harness_bin, str(tmp_path), SLOT_BYTES, POOL_BYTES)
    d.start()
    yield d
    d.stop()
    if os.path.exists(d.pool):
        os.unlink(d.pool)


# -- RequestRunner over kvtier's spec ----------------------------------------------


def kvtier_extra_config(address: str) -> Dict[str, Any]:
    """What an engine's kv_connector_extra_config names to load kvtier."""
    return {"spec_name": "KvtierOffloadingSpec", "spec_module_path": "kvtier_vllm",
            "kvtier_address": address}


class _Recorder:
    """kvtier's OffloadingWorker, with the bookkeeping of vLLM's
    MockOffloadingWorker that RequestRunner reads (utils.py): which jobs were
    submitted with which specs, which completed, which were waited on.
    kvtier's CPU worker copies in submit_*; the completion is reported to
    vLLM when the runner completes transfers or waits on the job, as the
    mock does, so the runner's held-transfer scenarios hold."""

    def __init__(self, real):
        from vllm.v1.kv_offload.base import OffloadingWorker

        rec = self

        class Worker(OffloadingWorker):
            def submit_store(self, job_id, src_spec, dst_spec):
                return rec._submit(job_id, src_spec, dst_spec,
                                   real.submit_store(job_id, src_spec, dst_spec))

            def submit_load(self, job_id, src_spec, dst_spec, expedited=False):
                return rec._submit(job_id, src_spec, dst_spec,
                                   real.submit_load(job_id, src_spec, dst_spec, expedited))

            def get_finished(self):
                out, rec.released = rec.released, []
                return out

            def wait(self, job_ids):
                real.wait(job_ids)
                rec.flushed_jobs |= set(job_ids)
                rec.complete_jobs(job_ids)

            def shutdown(self):
                real.shutdown()

        self.real = real
        self.worker = Worker()
        self.transfer_specs: Dict[int, tuple] = {}
        self.waiting_jobs: set = set()
        self.completed_jobs: List[int] = []
        self.flushed_jobs: set = set()
        self.results: Dict[int, Any] = {}
        self.released: List[Any] = []

    def _submit(self, job_id, src_spec, dst_spec, accepted: bool) -> bool:
        if accepted:
            self.transfer_specs[job_id] = (src_spec, dst_spec)
            self.waiting_jobs.add(job_id)
        return accepted

    def complete_jobs(self, job_ids) -> None:
        for r in self.real.get_finished():
            self.results[r.job_id] = r
        for job in sorted(job_ids):
            if job not in self.waiting_jobs:
                continue
            if job not in self.results:  # an asynchronous copy path: wait for it
                self.real.wait({job})
                for r in self.real.get_finished():
                    self.results[r.job_id] = r
            self.waiting_jobs.remove(job)
            self.completed_jobs.append(job)
            self.released.append(self.results.pop(job))

    # MockOffloadingSpec's API, which RequestRunner calls on the worker's spec
    def complete_transfers(self) -> None:
        self.complete_jobs(self.waiting_jobs.copy())

    def get_completed_transfers(self):
        specs = [self.transfer_specs[j] for j in self.completed_jobs]
        self.completed_jobs.clear()
        return specs

    def get_flushed_transfers(self):
        specs = [self.transfer_specs[j] for j in self.flushed_jobs]
        self.flushed_jobs.clear()
        return specs


class KvtierAnswerDiffers(AssertionError):
    """vLLM's test dictates a manager answer that kvtier's manager, from its
    real state, does not give: the scenario does not apply to kvtier."""


_NOT_DICTATED = object()


def _same_answer(dictated, real) -> bool:
    from vllm.v1.kv_offload.base import PrepareStoreOutput

    if isinstance(dictated, PrepareStoreOutput) or isinstance(real, PrepareStoreOutput):
        if dictated is None or real is None:
            return dictated is real
        return (list(dictated.keys_to_store) == list(real.keys_to_store)
                and list(dictated.evicted_keys) == list(real.evicted_keys))
    if not isinstance(dictated, (str, bytes)) and hasattr(dictated, "__iter__") \
            and isinstance(real, (list, tuple)):
        return list(dictated) == list(real)
    return dictated == real


def _retry_for_hit(dictated, real) -> bool:
    """kvtier's one deliberate difference in lookup answers (docs/VLLM.md,
    "Where kvtier differs on purpose", item 3): the first lookup of a key
    kvtierd holds answers RETRY (its leasing lookup goes out without
    waiting), the next step's HIT. vLLM's scheduler asks again; so a RETRY
    where the test dictates HIT is kvtier's HIT, one step later."""
    from vllm.v1.kv_offload.base import LookupResult

    return dictated is LookupResult.HIT and real is LookupResult.RETRY


def _spy_class():
    """The MagicMock RequestRunner expects as its manager, over kvtier's:
    every call goes to kvtier's manager, whose answer is what vLLM gets; where
    the test dictates an answer (side_effect, return_value), the test's side
    effect runs as with the mock, and its answer must be kvtier's."""
    from unittest import mock

    class KvtierSpy(mock.MagicMock):
        def _execute_mock_call(self, *args, **kwargs):
            real = self._mock_wraps
            if real is None:
                return super()._execute_mock_call(*args, **kwargs)
            answer = real(*args, **kwargs)
            dictated = _NOT_DICTATED
            effect = self.side_effect
            if effect is not None:
                if mock._is_exception(effect):
                    dictated = effect
                else:
                    result = effect(*args, **kwargs) if callable(effect) else next(effect)
                    if result is not mock.DEFAULT:
                        dictated = result
            if dictated is _NOT_DICTATED and self._mock_return_value is not mock.DEFAULT:
                dictated = self.return_value
            if (dictated is not _NOT_DICTATED and not _same_answer(dictated, answer)
                    and not _retry_for_hit(dictated, answer)):
                raise KvtierAnswerDiffers(
                    f"vLLM's test dictates manager.{self._mock_name}(...) -> {dictated!r}; "
                    f"kvtier's manager answers {answer!r}")
            return answer

    return KvtierSpy


def _either(orig, other):
    """A stand-in for one of RequestRunner's mock classes: constructs the
    mock as before, and isinstance() accepts kvtier's counterpart too."""

    class Either(type):
        def __instancecheck__(cls, obj):
            return isinstance(obj, (orig, other))

        def __call__(cls, *a, **kw):
            return orig(*a, **kw)

    return Either(orig.__name__, (), {})


class _OverlaidTorch:
    """``torch`` as RequestRunner's ``__init__`` sees it where it allocates
    its KV caches, one ``torch.empty`` per layer. Its KVCacheConfig says what
    a vLLM 0.33 engine allocates: every group's KVCacheTensor placed in one
    allocation, layer i of every group on the same bytes ("Groups overlay one
    allocation, sized by the largest group", utils.py; "layer i of every group
    aliases the same bytes", test_worker.py::test_register_kv_caches), and
    vLLM plans a block's bytes from it (worker_kv_bytes_per_block = that
    allocation's size / num_blocks). vLLM's mock worker never reads the
    tensors; kvtier's copies them and sizes its slots by them. So each
    layer's tensor is a view into one allocation at the offset the
    KVCacheConfig gives it -- where all groups have one page size (one block
    stride); otherwise each keeps a tensor of its own, as before."""

    def __init__(self, kv_cache_groups, num_blocks: int):
        import torch

        self._torch = torch
        self._layers: List[tuple] = []  # (nbytes, offset) of each torch.empty call, in order
        self._buf = None
        if kv_cache_groups and len(kv_cache_groups) > 1 and \
                len({g.kv_cache_spec.page_size_bytes for g in kv_cache_groups}) == 1:
            for g in kv_cache_groups:
                page = g.kv_cache_spec.page_size_bytes
                for j in range(len(g.layer_names)):
                    self._layers.append((page * num_blocks, j * page * num_blocks))
            size = max(len(g.layer_names) for g in kv_cache_groups) * page * num_blocks
            self._buf = torch.empty(size, dtype=torch.int8)

    def __getattr__(self, name):
        return getattr(self._torch, name)

    def empty(self, *shape, dtype=None, **kw):
        torch = self._torch
        if self._buf is None or not self._layers:
            return torch.empty(*shape, dtype=dtype, **kw)
        nbytes, offset = self._layers.pop(0)
        if math.prod(shape) * torch.empty(0, dtype=dtype).element_size() != nbytes:
            return torch.empty(*shape, dtype=dtype, **kw)
        return self._buf[offset:offset + nbytes].view(dtype).view(*shape)


class _KvtierHarness:
    """Makes vLLM's RequestRunner build its connectors with kvtier's spec
    (through spec_module_path, as an engine does) against ``daemon``, and
    read kvtier's objects where it reads its mock's. Undone at the test's
    end (monkeypatch)."""

    def __init__(self, monkeypatch, daemon):
        import torch
        from vllm.v1.kv_offload.base import OffloadingManager

        from kvtier_vllm.spec import KvtierOffloadingSpec
        from kvtier_vllm.transfer import KvtierLoadStoreSpec

        utils = importlib.import_module(UTILS)
        self.daemon = daemon
        self.managers: list = []
        self.recorders: List[_Recorder] = []
        self.runners = 0
        extra = kvtier_extra_config(daemon.address)
        real_runner = utils.RequestRunner
        get_manager = KvtierOffloadingSpec.get_manager
        get_worker = KvtierOffloadingSpec.get_worker
        spy_cls = _spy_class()
        step_time = os.environ.get("KVTIER_HARNESS_STEP_TIME", "1") != "0"

        def runner(*args, extra_config_overrides=None, **kw):
            bound = inspect.signature(real_runner).bind(*args, **kw)
            bound.apply_defaults()
            monkeypatch.setattr(utils, "torch", _OverlaidTorch(
                bound.arguments["kv_cache_groups"], bound.arguments["num_gpu_blocks"]))
            # Each RequestRunner is an engine with an offload tier of its own
            # (its own mock): each gets its own kvtier namespace.
            self.runners += 1
            own = {"kvtier_namespace_salt": f"runner-{self.runners}"}
            try:
                return real_runner(*args, extra_config_overrides={
                    **(extra_config_overrides or {}), **extra, **own}, **kw)
            finally:
                monkeypatch.setattr(utils, "torch", torch)

        def spy_manager(spec):
            spy = spec.__dict__.get("_harness_manager")
            if spy is None:
                real = get_manager(spec)
                if step_time:
                    # RequestRunner has no forward pass: its steps take
                    # microseconds where an engine's take milliseconds, the
                    # time kvtier's manager counts on for kvtierd's replies
                    # (sent at on_schedule_end, read at the next step). After
                    # each step, that time passes.
                    end = real.on_schedule_end

                    def on_schedule_end(context=None, _end=end, _m=real):
                        _end(context)
                        _m.settle()

                    real.on_schedule_end = on_schedule_end
                spy = spec._harness_manager = spy_cls(spec=OffloadingManager, wraps=real)
                self.managers.append(real)
            return spy

        def recorded_worker(spec, kv_caches):
            rec = spec.__dict__.get("_harness_recorder")
            if rec is None:
                rec = spec._harness_recorder = _Recorder(get_worker(spec, kv_caches))
                self.recorders.append(rec)
            return rec.worker

        def recorder(spec) -> _Recorder:
            return spec._harness_recorder

        monkeypatch.setattr(utils, "RequestRunner", runner)
        monkeypatch.setattr(KvtierOffloadingSpec, "get_manager", spy_manager)
        monkeypatch.setattr(KvtierOffloadingSpec, "get_worker", recorded_worker)
        # MockOffloadingSpec's API, on the worker side's spec
        for name in ("complete_transfers", "get_completed_transfers", "get_flushed_transfers"):
            monkeypatch.setattr(KvtierOffloadingSpec, name,
                                (lambda n: lambda spec: getattr(recorder(spec), n)())(name),
                                raising=False)
        monkeypatch.setattr(KvtierOffloadingSpec, "handler", property(recorder), raising=False)
        # A transfer's offloaded address: kvtier's slot in its pool.
        monkeypatch.setattr(KvtierLoadStoreSpec, "offload_keys",
                            property(lambda s: [(s.pool.path, int(b)) for b in s.block_ids]),
                            raising=False)
        monkeypatch.setattr(utils, "MockOffloadingSpec",
                            _either(utils.MockOffloadingSpec, KvtierOffloadingSpec))
        monkeypatch.setattr(utils, "MockLoadStoreSpec",
                            _either(utils.MockLoadStoreSpec, KvtierLoadStoreSpec))
        self.RequestRunner = runner

    def close(self) -> None:
        for rec in self.recorders:
            rec.real.shutdown()
        for m in self.managers:
            m.shutdown()


@pytest.fixture
def kvtier_harness(monkeypatch, kvtier_harness_daemon):
    h = _KvtierHarness(monkeypatch, kvtier_harness_daemon)
    yield h
    h.close()


@pytest.fixture(autouse=True)
def _kvtier_spec_for_vllm_runner(request):
    """vLLM's tests that build a RequestRunner (its request_runner fixture)
    get kvtier's spec."""
    if "request_runner" in request.fixturenames:
        request.getfixturevalue("kvtier_harness")


# -- kvtier scenarios on vLLM's RequestRunner --------------------------------------


def _vllm_harness_or_skip():
    try:
        import vllm
    except Exception:
        pytest.skip("vLLM is not installed in this interpreter")
    if vllm.__version__.split("+")[0] != VLLM_VERSION:
        pytest.skip(f"vLLM {vllm.__version__}: the harness is vLLM {VLLM_VERSION}'s "
                    "(bash scripts/vllm-harness.sh)")
    try:
        return importlib.import_module(UTILS)
    except ImportError:
        pytest.skip(f"vLLM {VLLM_VERSION}'s test tree is not on sys.path "
                    "(bash scripts/vllm-harness.sh fetches it)")


@pytest.fixture
def kvtier_runner(request, monkeypatch):
    """RequestRunner factory over kvtier's spec (for the scenarios below)."""
    utils = _vllm_harness_or_skip()
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        # As vLLM's tests/v1/kv_connector/unit/conftest.py does on a CPU machine.
        from vllm.v1.attention.backend import MultipleOf
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        monkeypatch.setattr(CPUAttentionBackend, "get_supported_kernel_block_sizes",
                            staticmethod(lambda kv_cache_spec=None: [MultipleOf(16)]))
    harness = request.getfixturevalue("kvtier_harness")
    return harness, utils


@pytest.mark.parametrize("blocks_per_chunk", [1, 3])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_kvtier_round_trip_through_vllm_connector(kvtier_runner, async_scheduling,
                                                  blocks_per_chunk):
    """A prompt's chunks go to kvtier and come back, through vLLM's
    scheduler and connector: the same prompt, after the GPU prefix cache is
    dropped and the KV caches zeroed, loads every chunk kvtier stored; each
    loaded block holds the bytes stored from that position."""
    import torch

    harness, utils = kvtier_runner
    block = 4
    chunks = 2
    runner = harness.RequestRunner(block_size=block, num_gpu_blocks=100,
                                   async_scheduling=async_scheduling,
                                   blocks_per_chunk=blocks_per_chunk)
    rec = runner.offloading_spec.handler
    engine = rec.real._engine  # kvtier's worker's views of the KV caches, per tensor
    for t in engine:
        rows = torch.arange(t.shape[0]).unsqueeze(1) * 7 + torch.arange(t.shape[1])
        t.copy_((rows % 251 - 125).to(torch.int8))

    def block_ids():  # the request's GPU block of each offset (RequestRunner's map)
        return {g.request_block_offset: b for b, g in runner.gpu_blocks.items()}

    n = chunks * blocks_per_chunk
    prompt = list(range(1, block * n + 2))  # n full blocks and one token more
    runner.new_request(token_ids=prompt)
    runner.run(decoded_tokens=[utils.EOS_TOKEN_ID], expected_stored=tuple(range(n)))
    first = block_ids()
    stored = {o: [t[first[o]].clone() for t in engine] for o in range(n)}

    runner.scheduler.reset_prefix_cache()
    for t in engine:
        t.zero_()
    runner.gpu_blocks.clear()
    runner.new_request(token_ids=prompt)
    runner.run(decoded_tokens=[utils.EOS_TOKEN_ID], expected_loaded=tuple(range(n)))
    second = block_ids()
    for o in range(n):
        for t, want in zip(engine, stored[o]):
            assert torch.equal(t[second[o]], want), f"the block at offset {o} differs"
    for m in harness.managers:
        m.settle()
    harness.daemon.wait_quiet(what="after both requests finished")
