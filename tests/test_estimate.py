"""The study's time estimate: its arithmetic, the machine facts it reads, and what a
user sees before anything runs."""

from __future__ import annotations

import math
import os
import statistics

import pytest

from tests.conftest import REPO
from tests.estimates import calibration, machine
from workflow_scripts import metrics, study, sysinfo, workloads
from workflow_scripts.plan import estimate, estimate_text, study_estimate
from workflow_scripts.plan.study_estimate import Known, Setup
from workflow_scripts.rank import gradcheck, references
from workflow_scripts.study.entry import read_config


def test_cnn_flops_by_hand():
    # models.SmallCNN at 8 px: convolutions 3->32 at 8x8, 32->64 at 4x4, 64->64 at 2x2
    # (3x3 kernels, 2 FLOPs a multiply-add), then linears 1024->128->10
    convs = 2 * 9 * (3 * 32 * 64 + 32 * 64 * 16 + 64 * 64 * 4)
    linears = 2 * (1024 * 128 + 128 * 10)
    assert estimate.forward_flops({"model": "cnn", "image_size": 8}) == convs + linears
    assert estimate.train_flops_per_sample({"model": "cnn", "image_size": 8}) == 3 * (
        convs + linears
    )
    # ResNet-50 at 224 px: 2 x 4.09 GMAC forward, ~24.5 GFLOP a training sample
    assert estimate.train_flops_per_sample(
        {"model": "resnet50", "image_size": 224}
    ) == pytest.approx(24.5e9, rel=0.01)
    assert estimate.forward_flops({"model": "resnet18", "image_size": 112}) == pytest.approx(
        2 * 1.81e9 / 4
    )
    assert estimate.forward_flops({"model": "no-such-model", "image_size": 32}) is None


def test_one_trial_by_hand(make_spec):
    spec = make_spec(model="resnet50", image_size=224, batch_size=16, warmup_steps=2, steps=8)
    spec = spec | {"time_budget_s": None}
    est = estimate.trial(spec, machine(calibration()))
    step = 24.54e9 * 16 / (100.0 * estimate.EFFICIENCY * 1e9) + estimate.STEP_OVERHEAD_S
    assert est["step_s"] == pytest.approx(step, rel=1e-3)
    parts = est["parts"]
    assert parts["start"] == 3.0  # the calibration's measured process start
    assert parts["warmup"] == pytest.approx(2 * step, rel=1e-3)
    assert parts["timed"] == pytest.approx(8 * step, rel=1e-3)
    assert parts["probes"] == 2 * estimate.PROBE_S and parts["compile"] == 0
    assert est["seconds"] == pytest.approx(sum(parts.values()), abs=0.05)
    assert est["basis"] == "calibration" and not est["capped"]


def test_bf16_scales_by_the_ratio_of_the_models_kind(make_spec):
    """A text model's bf16 step scales by the calibration's transformer proxy, a vision
    model's by its convolution one; a calibration from before the text proxy scales both
    by the convolution one."""
    cal = {**calibration(bf16_ratio=15.0), "text_proxy": {"bf16_over_fp32": 40.0}}
    older = calibration(bf16_ratio=15.0)
    for model, extra, ratio in (("resnet50", {"image_size": 224}, 15.0),
                                ("bert-base", {"seq_len": 128}, 40.0)):  # fmt: skip
        fp32 = {**make_spec(model=model, batch_size=8, steps=8, **extra), "time_budget_s": None}
        bf16 = {**fp32, "precision": "bf16"}
        a = estimate.trial(fp32, machine(cal))["step_s"] - estimate.STEP_OVERHEAD_S
        b = estimate.trial(bf16, machine(cal))["step_s"] - estimate.STEP_OVERHEAD_S
        assert b == pytest.approx(ratio * a, rel=1e-3), model
        c = estimate.trial(bf16, machine(older))["step_s"] - estimate.STEP_OVERHEAD_S
        assert c == pytest.approx(15.0 * a, rel=1e-3), model


def test_the_flop_count_costs_the_same_whatever_the_run(make_spec):
    """The FLOP count traces one step of one sample on fake tensors (rank/measure.py): no
    arithmetic, so a bf16, compiled, larger or batched run's count costs what the fp32
    eager one's does (where it was a real step, bf16 emulated cost 16-44x)."""
    m = machine(calibration(bf16_ratio=40.0))
    fp32 = {
        **make_spec(model="bert-base", seq_len=128, batch_size=16, steps=8),
        "time_budget_s": None,
    }
    count = estimate.trial(fp32, m)["parts"]["flop_count"]
    assert count == estimate.FLOP_COUNT_S
    others = ({"precision": "bf16"}, {"backend": "inductor"}, {"batch_size": 1})
    for other in (*others, {"model": "cnn", "image_size": 32, "seq_len": None}):
        assert estimate.trial({**fp32, **other}, m)["parts"]["flop_count"] == count


def test_bf16_scales_by_the_measured_ratio_and_budget_and_timeout_cut(make_spec):
    fp32 = make_spec(model="resnet50", image_size=224, batch_size=16, steps=8)
    fp32 = fp32 | {"time_budget_s": None}
    bf16 = {**fp32, "precision": "bf16"}
    m = machine(calibration(bf16_ratio=20.0))
    a, b = estimate.trial(fp32, m), estimate.trial(bf16, m)
    step = a["step_s"] - estimate.STEP_OVERHEAD_S
    assert b["step_s"] == pytest.approx(20 * step + estimate.STEP_OVERHEAD_S, rel=1e-3)
    # the harness stops timing once the timed steps passed the budget (2 at least)
    cut = estimate.trial({**bf16, "time_budget_s": 60}, m)
    assert cut["timed_steps"] == max(2, math.ceil(60 / b["step_s"]))
    assert cut["timed_steps"] < 8
    capped = estimate.trial({**bf16, "timeout_s": 30}, m)
    assert capped["seconds"] == 30 and capped["capped"]


def test_compile_torchrun_workers_and_epochs(make_spec):
    m = machine(calibration())
    base = estimate.trial(make_spec(), m)
    compiled = estimate.trial(make_spec(backend="inductor"), m)
    assert compiled["parts"]["compile"] == workloads.get("cnn").compile_s
    ddp = estimate.trial(make_spec(launcher="torchrun", ranks=2, threads=1), m)
    # the launcher's own process starts too, before its ranks
    assert ddp["parts"]["start"] == pytest.approx(3.0 * 2 + estimate.TORCHRUN_S)
    workers = estimate.trial(make_spec(data="per_sample", num_workers=2), m)
    assert workers["parts"]["harness"] == base["parts"]["harness"] + 2 * estimate.WORKER_START_S
    acc = estimate.trial(make_spec(data="digits", epochs=3, batch_size=32, image_size=32), m)
    assert acc["timed_steps"] == 3 * math.ceil(estimate.DIGITS_TRAIN_IMAGES / 32)


def test_a_served_models_compile_int8_step_and_frozen_later_compile(make_spec):
    """A served model compiles its forward graph alone; a later trial of a frozen graph
    (which Inductor's FX graph cache skips: prepacked oneDNN weights) compiles again from
    its other caches, dearer than an unfrozen one's; an INT8 step is a share of fp32's
    by the CPU's flags (VNNI or not)."""
    m = machine(calibration())
    serve = {"mode": "inference", "backend": "inductor", "optimizer": None,
             "time_budget_s": None}  # fmt: skip
    train = estimate.trial(make_spec(backend="inductor"), m)
    served = estimate.trial(make_spec(**serve), m)
    assert served["parts"]["compile"] == pytest.approx(
        train["parts"]["compile"] * estimate.INFERENCE_COMPILE_SHARE
    )
    frozen = make_spec(**serve, compile_freezing=True)
    plain_later = estimate.trial(make_spec(**serve), m, later=True)["parts"]["compile"]
    frozen_later = estimate.trial(frozen, m, later=True)["parts"]["compile"]
    assert frozen_later == pytest.approx(served["parts"]["compile"] * estimate.FROZEN_WARM_SHARE)
    assert frozen_later > plain_later
    big = {**serve, "compile_freezing": True, "model": "resnet50", "image_size": 224,
           "batch_size": 16}  # fmt: skip
    int8 = make_spec(**big, precision="int8")
    fp32 = estimate.trial(make_spec(**big), machine(calibration(), flags=["avx2", "avx512_vnni"]))
    vnni = estimate.trial(int8, machine(calibration(), flags=["avx2", "avx512_vnni"]))
    plain = estimate.trial(int8, machine(calibration(), flags=["avx2"]))
    overhead = estimate.STEP_OVERHEAD_S
    assert vnni["step_s"] - overhead == pytest.approx(
        estimate.INT8_VNNI_RATIO * (fp32["step_s"] - overhead), rel=1e-3
    )
    assert vnni["step_s"] < plain["step_s"] < fp32["step_s"]
    # a later IPEX INT8 trial quantizes from its first trial's calibration (Inductor's
    # PT2E calibrates in every trial)
    ipex = make_spec(**{**big, "compile_freezing": False, "backend": "ipex"}, precision="int8",
                     ipex_torchscript=True)  # fmt: skip
    first, later = estimate.trial(ipex, m), estimate.trial(ipex, m, later=True)
    assert later["parts"]["serve"] < first["parts"]["serve"]
    carried = estimate.trial(ipex, m, carries={"int8_calibration"})
    assert carried["parts"]["serve"] == later["parts"]["serve"]
    pt2e = (estimate.trial(int8, m), estimate.trial(int8, m, later=True))
    assert pt2e[0]["parts"]["serve"] == pt2e[1]["parts"]["serve"]


def test_without_a_calibration_the_quick_rate_and_the_flags_decide(make_spec):
    spec = make_spec(model="resnet50", image_size=224, batch_size=16, precision="bf16")
    spec = spec | {"time_budget_s": None}
    native = estimate.trial(spec, machine(quick=170.0, flags=["avx2", "avx512_bf16"]))
    emulated = estimate.trial(spec, machine(quick=170.0, flags=["avx2"]))
    assert "bf16 native" in native["basis"] and "bf16 emulated" in emulated["basis"]
    ratio = estimate.BF16_EMULATED_RATIO / estimate.BF16_NATIVE_RATIO
    assert (emulated["step_s"] - 0.01) == pytest.approx(ratio * (native["step_s"] - 0.01), 1e-3)
    # AVX-512 without BF16 (a VM may hide BF16 and AMX): emulated, but in AVX-512 registers,
    # a few times fp32's step and not the AVX2 fallback's tens of times
    avx512 = ["avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"]
    wide = estimate.trial(spec, machine(quick=170.0, flags=avx512))
    assert "bf16 emulated on AVX-512" in wide["basis"]
    ratio = estimate.BF16_AVX512_RATIO / estimate.BF16_NATIVE_RATIO
    assert (wide["step_s"] - 0.01) == pytest.approx(ratio * (native["step_s"] - 0.01), 1e-3)
    assert native["step_s"] < wide["step_s"] < emulated["step_s"]
    assert estimate.bf16_kind(avx512 + ["amx_bf16"]) == "native"
    assert estimate.bf16_kind(["avx2", "avx512f"]) == "emulated"  # no AVX-512BW: AVX2's kernels
    # and the report names the ISA by the same rule
    from workflow_scripts.report.machines import isa_verdict

    assert isa_verdict(set(avx512))[0] == "AVX-512 (no BF16)"
    assert isa_verdict({"avx2", "avx512f"})[0] == "AVX2 only"
    # a container's start is dearer than a local process's, before anything measured it
    local = estimate.trial(spec, machine(quick=170.0))
    boxed = estimate.trial(spec, machine(quick=170.0, container=True))
    assert boxed["parts"]["start"] == local["parts"]["start"] + estimate.CONTAINER_START_S


def _study(preset: str):
    return study.load_study(read_config(REPO / "config.yaml", [f"preset={preset}"]), REPO)


def test_a_later_trial_carries_the_first_ones_one_off_work(make_spec):
    """Trial 1, 2, ... compile from trial 0's cache and carry its FLOP count and gradient
    check (trial/carry.py): the estimate of a later trial leaves them out, and the
    study's estimate and its adaptive rounds count each trial as first or later."""
    m = machine(calibration())
    spec = make_spec(backend="inductor")
    first, later = estimate.trial(spec, m), estimate.trial(spec, m, later=True)
    assert later["parts"]["compile"] == pytest.approx(
        workloads.get("cnn").compile_s * estimate.WARM_COMPILE_SHARE
    )
    assert later["parts"]["grad_check"] == 0 < first["parts"]["grad_check"]
    assert later["parts"]["flop_count"] == 0 < first["parts"]["flop_count"]
    assert later["parts"]["timed"] == first["parts"]["timed"]
    est = study_estimate.total([spec], 3, m)
    assert est["trials_s"] == pytest.approx(first["seconds"] + 2 * later["seconds"], abs=0.1)
    assert est["experiments"][spec["id"]]["later_seconds"] == later["seconds"]
    most = study_estimate.with_rounds(est, 3, 5)["adaptive"]["total_s"]
    # each adaptive round with the report before it that decides who runs it
    round_s = later["seconds"] + estimate.report_s(1)
    assert most == pytest.approx(est["total_s"] + 2 * round_s, abs=0.1)


def test_a_reference_step_another_experiment_made_is_read_not_made(make_spec):
    """The gradient check's references are shared by the experiments that ask for the
    same step (rank/references.py): the study's estimate makes each once, in its order,
    and a first trial that finds one in the folder is estimated to read it."""
    m = machine(calibration())
    bf16 = make_spec(id="bf16", precision="bf16")  # plain eager: fp64 only
    compiled = make_spec(id="ind", backend="inductor", precision="bf16")  # fp64 and bf16
    other = make_spec(id="cl", precision="bf16", channels_last=True)  # another step
    assert gradcheck.reference_kinds(bf16) == ["fp64"]
    assert gradcheck.reference_kinds(compiled) == ["fp64", "bf16"]
    assert gradcheck.reference_kinds(make_spec(id="fp32")) == []  # its own reference
    # (a data-parallel run: each rank its own, averaged after: fp64 and eager at fp32)
    ddp = make_spec(id="d", launcher="torchrun", ranks=2)
    assert gradcheck.reference_kinds(ddp) == ["fp64", "fp32"]
    # the plan key names the torch an environment pins, not the environment or the
    # launcher: one torchrun rank in the oneccl environment (upstream's torch) asks for
    # bf16's step; the ipex environment pins another torch
    ccl = make_spec(id="c", precision="bf16", launcher="torchrun", dist_backend="ccl")
    ipex = make_spec(id="i", precision="bf16", backend="ipex")
    assert (ccl["env"], ipex["env"]) == ("oneccl", "ipex")
    assert references.key_name(ccl, "fp64") == references.key_name(bf16, "fp64")
    assert references.key_name(ipex, "fp64") != references.key_name(bf16, "fp64")
    alone = {s["id"]: estimate.trial(s, m)["parts"]["grad_check"] for s in (bf16, compiled, other)}
    est = study_estimate.total([bf16, compiled, other], 1, m)
    parts = {e: v["parts"]["grad_check"] for e, v in est["experiments"].items()}
    assert parts["bf16"] == alone["bf16"] and parts["cl"] == alone["cl"]
    # (the compiled rung still makes its bf16 eager reference)
    fp64 = alone["bf16"] - estimate.REFERENCE_READ_S
    assert parts["ind"] == pytest.approx(alone["ind"] - fp64, abs=0.02)
    read = estimate.trial(compiled, m, carries=estimate.reference_carries(["fp64", "bf16"]))
    assert read["parts"]["grad_check"] == pytest.approx(2 * estimate.REFERENCE_READ_S, abs=0.02)


def test_references_beyond_the_folders_size_go_least_recently_used_first(tmp_path):
    paths = []
    for i, name in enumerate("abcd"):
        p = tmp_path / f"{name}.pt"
        p.write_bytes(b"x" * 100)
        (tmp_path / f"{name}.json").write_text("{}")
        os.utime(p, (1000 + i, 1000 + i))
        paths.append(p)
    os.utime(paths[0], (2000, 2000))  # a, read since: the most recently used
    gone = references.evict(tmp_path, 250, keep=paths[1])
    assert gone == [paths[2], paths[3]]  # (b, just made, is kept)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "a.pt", "b.json", "b.pt"]
    assert references.evict(tmp_path, 1000) == []


def test_the_default_study_on_an_avx2_machine_takes_hours():
    """What a user of a 2-core AVX2 machine reads before starting the default study."""
    st = _study("default")
    avx2 = estimate.Machine({}, 170.0, 2, ["avx2", "fma"])
    est = study_estimate.total(st.experiments, st.settings["trials"], avx2, setup=Setup(st.envs))
    assert est["total_s"] > 3600
    text = estimate_text.format_estimate(est, st.settings["trials"])
    assert " h on this machine" in text.splitlines()[0]
    assert "[estimate]   ladder:" in text and "bf16 emulated" in text
    # the same study where bf16 is native: its bf16 runs take a fraction of the time
    native = estimate.Machine({}, 170.0, 2, ["avx2", "avx512_bf16"])
    faster = study_estimate.total(
        st.experiments, st.settings["trials"], native, setup=Setup(st.envs)
    )
    assert faster["total_s"] < est["total_s"]
    bf16 = [s for s in st.experiments if s["precision"] == "bf16"]
    emulated = sum(estimate.trial(s, avx2)["seconds"] for s in bf16)
    assert sum(estimate.trial(s, native)["seconds"] for s in bf16) < emulated / 3
    # the user reads what the bf16 runs cost where they are slow, and only there
    share = est["bf16"]
    assert share["experiments"] == len(bf16) and 0 < share["seconds"] < est["trials_s"]
    line = next(x for x in text.splitlines() if "bf16 trains slower" in x)
    assert f"its {len(bf16)} runs take about" in line and "emulated" in line
    assert f"{estimate.BF16_EMULATED_RATIO:.0f}x fp32's" in line
    assert "bf16 trains slower" not in estimate_text.format_estimate(faster, st.settings["trials"])
    # a calibration where bf16 is slower on a CPU with AVX-512 BF16 says so, not "emulated"
    slow = estimate.Machine({"upstream": calibration(bf16_ratio=1.5)}, None, 2, ["avx512_bf16"])
    said = estimate_text.format_estimate(
        study_estimate.total(bf16[:1], 2, slow, setup=Setup(["upstream"])), 2
    )
    assert "bf16 trains slower than fp32 here (a step 1.5x fp32's): its 1 run takes" in said


def test_groups_sum_and_records_already_made_are_not_remaining():
    st = _study("quick")
    m = estimate.Machine({}, 100.0, 2, ["avx2"])
    est = study_estimate.total(st.experiments, 1, m, setup=Setup(st.envs, 2))
    assert sum(g["seconds"] for g in est["groups"].values()) == pytest.approx(est["trials_s"], 0.01)
    assert sum(g["trials"] for g in est["groups"].values()) == len(st.experiments)
    assert est["setup"]["collectives"] == 2 * estimate.COLLECTIVES_S
    first = st.experiments[0]["id"]
    done = study_estimate.total(
        st.experiments, 1, m, setup=Setup(st.envs), known=Known([(first, 0)])
    )
    assert done["remaining_trials_s"] == pytest.approx(
        est["trials_s"] - est["experiments"][first]["seconds"], abs=0.2
    )
    said = estimate_text.format_estimate(done, 1)
    assert "without a record yet" in said
    # each group says what of it is left: the one with the record done, its trials less one
    group = st.experiments[0].get("group") or first
    g = done["groups"][group]
    assert g["left_trials"] == g["trials"] - 1
    left_s = g["seconds"] - est["experiments"][first]["seconds"]
    assert g["left_s"] == pytest.approx(left_s, abs=0.2)
    line = next(t for t in said.splitlines() if t.startswith(f"[estimate]   {group}:"))
    n = g["left_trials"]
    assert line.endswith(
        f"of it left ({n} trial{'' if n == 1 else 's'} without a record)"
        if n
        else ", every trial done"
    ), line
    # a fresh study's group lines are the whole study's: nothing said of what is left
    assert "of it left" not in estimate_text.format_estimate(est, 1)


def test_calibration_times_come_from_the_calibrations():
    m = machine(calibration(wall=25.0))
    assert m.calibration_s("upstream") == 25.0
    assert machine().calibration_s("upstream") == estimate.CALIBRATION_S


def test_quick_measurement_is_a_rate():
    rate = estimate.quick_fp32_gflops(size=128, min_seconds=0.02)
    assert rate is not None and rate > 0.1


def test_the_setup_imports_come_from_the_calibration(make_spec):
    """Every trial's setup imports torch._dynamo (its optimizer does): the calibration
    measures what that costs in the environment, the estimate adds it."""
    cal = {**calibration(), "dynamo_import_s": 7.5}
    measured = estimate.trial(make_spec(), machine(cal))
    assert measured["parts"]["harness"] == pytest.approx(estimate.HARNESS_S + 7.5)
    default = estimate.trial(make_spec(), machine(calibration()))
    assert default["parts"]["harness"] == pytest.approx(
        estimate.HARNESS_S + estimate.SETUP_IMPORT_S
    )


def test_a_served_model_costs_its_training_calibration_and_checks(make_spec):
    """Inference: the steps are the forward alone; a model trained first (epochs) costs
    its training steps and two scorings of the held-out split, an INT8 one its
    calibration, a TorchScript or INT8 one its preparation; the steps stay the spec's."""
    m = machine(calibration())
    plain = estimate.trial(make_spec(mode="inference"), m)
    step = plain["step_s"]
    assert plain["timed_steps"] == 3
    assert plain["parts"]["serve"] == pytest.approx(estimate.SERVE_CHECK_STEPS * step, abs=0.01)
    int8 = make_spec(mode="inference", precision="int8", backend="ipex", ipex_torchscript=True)
    got = estimate.trial(int8, m)["parts"]["serve"]
    calibration_s = 4 * 2 * step + estimate.SERVE_PREPARE_S
    assert got == pytest.approx(plain["parts"]["serve"] + calibration_s, abs=0.02)
    trained = make_spec(mode="inference", data="digits", epochs=3, batch_size=32, lr=0.02)
    trained = trained | {"time_budget_s": None}
    est = estimate.trial(trained, m)
    assert est["timed_steps"] == 3  # the forward passes, not the training's steps
    fp32_forward = estimate.forward_flops(trained) * 32 / (100.0 * estimate.EFFICIENCY * 1e9)
    training = 3 * math.ceil(1437 / 32) * 3 * (fp32_forward + estimate.STEP_OVERHEAD_S)
    scoring = 2 * math.ceil(360 / 32) * est["step_s"]
    assert est["parts"]["serve"] == pytest.approx(
        estimate.SERVE_CHECK_STEPS * est["step_s"] + training + scoring, rel=0.01
    )
    # serving another run's weights: scored, not trained again
    loaded = estimate.trial({**trained, "weights_from": "other"}, m)
    assert loaded["parts"]["serve"] == pytest.approx(est["parts"]["serve"] - training, rel=0.01)
    # a later trial loads its first trial's weights (trial/carry.py): not trained again
    for later in (estimate.trial(trained, m, later=True),
                  estimate.trial(trained, m, carries={"weights"})):  # fmt: skip
        assert later["parts"]["serve"] == pytest.approx(loaded["parts"]["serve"], rel=0.01)


def test_a_run_predicted_far_from_its_baseline_runs_one_trial_of_two_timed_steps():
    """Where bf16 is emulated (20x slower), the bf16 rungs are far from their fp32
    baseline: the estimate gives them one trial that stops after two timed steps
    (plan/far.py, plan/rounds.py), and counts the trials each experiment runs; where
    bf16 is native (2x faster) they are far too, but an fp32 rung near its baseline is not."""
    st = _study("default")
    avx2 = estimate.Machine({}, 170.0, 2, ["avx2", "fma"])
    est = study_estimate.total(st.experiments, 2, avx2, setup=Setup(st.envs))
    per = est["experiments"]
    assert "bf16" in est["far"] and "inductor-fp32" not in est["far"]
    assert per["bf16"]["trials"] == 1 and per["bf16"]["timed_steps"] <= 2
    assert per["bf16"]["timed_steps"] < per["baseline"]["timed_steps"]
    assert per["baseline"]["trials"] == per["inductor-fp32"]["trials"] == 2
    # a seed sweep's 3 seeds: one trial each
    assert {per[e]["trials"] for e in per if e.startswith("acc-")} == {1}
    assert est["planned_trials"] == sum(v["trials"] for v in per.values())
    assert est["planned_trials"] < 2 * len(per)
    assert sum(g["trials"] for g in est["groups"].values()) == est["planned_trials"]
    # only those that ran the minimum may go on in the adaptive rounds
    assert est["adaptive_experiments"] == sum(1 for v in per.values() if v["trials"] == 2)
    text = estimate_text.format_estimate(study_estimate.with_rounds(est, 2, 4), 2)
    low = est["planned_trials"]
    high = low + 2 * est["adaptive_experiments"]
    assert f"{low} trials: 2 per experiment, fewer for" in text
    assert f"adaptive rounds: {low} to {high} trials" in text
    # once a first trial has run, what it did counts, not the prediction
    known = study_estimate.total(
        st.experiments, 2, avx2, setup=Setup(st.envs), known=Known(far={"bf16": False})
    )
    assert known["experiments"]["bf16"]["trials"] == 2
    assert known["planned_trials"] == est["planned_trials"] + 1
    # one that stopped far but short of the factor squared runs its trials, each
    # stopping at its first two timed steps; beyond the square, its first is its last,
    # of one timed step (rank/harness.py)
    factor = float(next(s for s in st.experiments if s["id"] == "bf16")["far_stop"])
    for ratio, trials, steps in ((factor * 1.1, 2, 2), (factor**2 * 1.1, 1, 1)):
        seen = study_estimate.total(
            st.experiments, 2, avx2, setup=Setup(st.envs), known=Known(far={"bf16": ratio})
        )["experiments"]["bf16"]
        assert (seen["trials"], seen["timed_steps"]) == (trials, steps), ratio
    # a far stop within the margin settles nothing: the bf16 rungs run their trials
    wide = study_estimate.total(st.experiments, 2, avx2, setup=Setup(st.envs), margin=0.6)
    assert wide["experiments"]["bf16"]["trials"] == 2 and "bf16" not in wide["far"]
    assert wide["experiments"]["bf16"]["timed_steps"] == per["bf16"]["timed_steps"]


def test_a_trial_forked_from_a_warm_interpreter_pays_no_process_start(make_spec):
    """Where one-process trials are forked (runtime local: runtimes/warm.py), their start
    is the fork's; a torchrun trial, or one pinned to its own CPUs, starts fresh."""
    fresh = estimate.Machine({}, 100.0, 2, ["avx2"])
    forks = estimate.Machine({}, 100.0, 2, ["avx2"], forks=True)
    plain = make_spec()
    assert estimate.trial(plain, forks)["parts"]["start"] == estimate.FORK_START_S
    assert estimate.trial(plain, fresh)["parts"]["start"] == estimate.PROCESS_START_S
    cut = estimate.PROCESS_START_S - estimate.FORK_START_S
    assert estimate.trial(plain, fresh)["seconds"] - estimate.trial(plain, forks)["seconds"] == (
        pytest.approx(cut)
    )
    for spec in (make_spec(launcher="torchrun", threads=1), make_spec(cpus="0")):
        assert estimate.trial(spec, forks)["parts"]["start"] >= estimate.PROCESS_START_S


def _steps_with_spread(cv: float, n: int) -> list[float]:
    """``n`` step times of mean 1 whose sample coefficient of variation is ``cv``."""
    raw = [float(i) for i in range(n)]
    mean = statistics.fmean(raw)
    sd = statistics.stdev(raw)
    return [1.0 + cv * (x - mean) / sd for x in raw]


def test_a_trial_stopped_by_step_precision_is_predicted_at_its_average_steps(make_spec):
    m = machine(calibration())
    spec = make_spec(steps=100) | {"time_budget_s": None}
    every = estimate.trial(spec, m)
    stopped = estimate.trial(spec | {"step_precision": 0.02}, m)
    looser = estimate.trial(spec | {"step_precision": 0.1}, m)
    assert every["timed_steps"] == 100
    assert metrics.MIN_PRECISION_STEPS <= looser["timed_steps"] < stopped["timed_steps"] < 100
    assert stopped["parts"]["timed"] == pytest.approx(
        stopped["timed_steps"] * stopped["step_s"], rel=0.01
    )
    # the average of the counts at which the harness's own rule stops, at each decile
    counts = []
    for cv in estimate.STEP_CV_DECILES:
        n = next(
            (k for k in range(metrics.MIN_PRECISION_STEPS, 100)
             if metrics.known_within(_steps_with_spread(cv, k), 0.02)),
            100,
        )  # fmt: skip
        counts.append(n)
    assert stopped["timed_steps"] == pytest.approx(statistics.fmean(counts), abs=0.05)
    # never more than the steps, nor than the time budget's cut
    few = estimate.trial(make_spec(steps=4) | {"step_precision": 0.02}, m)
    assert few["timed_steps"] <= 4


def test_a_trials_own_estimate_leaves_out_what_it_carries(make_spec):
    """The estimate a trial records (and the budget's clock reads): a later trial that
    carries its first trial's gradient comparison and FLOP count does neither again;
    one that carries nothing pays for both; a compiled one warm from the cache pays
    the warm compile, as the study's estimate of a later trial says."""
    ref = calibration()
    spec = make_spec(precision="bf16")
    first = estimate.for_trial(spec, ref, container=False)
    assert first["parts"]["grad_check"] > 0 and first["parts"]["flop_count"] > 0
    every = {"from": "trial 0", "negligible": [], "flops_per_sample": 1e9}
    later = estimate.for_trial(spec, ref, container=False, carried=every)
    assert later["parts"]["grad_check"] == 0 and later["parts"]["flop_count"] == 0
    saved = first["parts"]["grad_check"] + first["parts"]["flop_count"]
    assert later["seconds"] == pytest.approx(first["seconds"] - saved, abs=0.03)
    flops_only = estimate.for_trial(
        spec, ref, container=False, carried={"from": "x", "flops_per_sample": 1e9}
    )
    assert flops_only["parts"]["grad_check"] == first["parts"]["grad_check"]
    assert flops_only["parts"]["flop_count"] == 0
    compiled = make_spec(precision="bf16", backend="inductor")
    warm = estimate.for_trial(compiled, ref, container=False, warm=True, carried=every)
    here = machine(  # the machine for_trial sees: this one's CPUs and flags
        ref, cpus=len(sysinfo.plan_cpus()), flags=sysinfo.topology().get("cpu_flags") or []
    )
    assert warm == estimate.trial(compiled, here, later=True)
    cold = estimate.for_trial(compiled, ref, container=False, carried=every)
    assert cold["parts"]["compile"] == estimate.for_trial(compiled, ref, False)["parts"]["compile"]


def test_a_trials_start_is_the_calibrations_warm_one():
    """The calibration's first start is cold (its files not yet cached); its second,
    warm, is what the trials pay; a calibration without one has its cold start."""
    both = calibration() | {"startup_s": 11.4, "warm_startup_s": 2.5}
    assert machine(both).process_start("upstream") == 2.5
    assert machine(calibration() | {"startup_s": 11.4}).process_start("upstream") == 11.4
    assert machine(None).process_start("upstream") == estimate.PROCESS_START_S
    hand_edited = calibration() | {"startup_s": 3.0, "warm_startup_s": -1.0}
    assert machine(hand_edited).process_start("upstream") == 3.0


def test_initial_weights_beyond_the_folders_size_go_least_recently_used_first(tmp_path):
    """The initial weights' folder (rank/initial_weights.py) is evicted the same way: its
    ``.bin`` files with their ``.json``, the least recently used first."""
    for i, name in enumerate("abc"):
        p = tmp_path / f"{name}.bin"
        p.write_bytes(b"x" * 100)
        (tmp_path / f"{name}.json").write_text("{}")
        os.utime(p, (1000 + i, 1000 + i))
    gone = references.evict(tmp_path, 200, keep=tmp_path / "a.bin", pattern="*.bin")
    assert gone == [tmp_path / "b.bin"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "a.json", "c.bin", "c.json"]
