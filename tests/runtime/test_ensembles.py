"""Ensembles at load: each configuration Triton refuses is refused with its text (the
configuration alone, its data flow, its steps against the step models' configurations, the
step models themselves), and the repository keeps Triton's order and links (an ensemble loads
after its steps, whatever the names' order; unloading a step model takes its ensembles out of
service; loading the ensemble before its steps fails, after them succeeds)."""

import asyncio
import shutil
from pathlib import Path

import pytest

from service.errors import InvalidInput
from service.runtime.repository import ModelRepository
from service.settings import Settings
from tests.triton_examples import write_repository

STEP = ('{{ model_name: "{model}" model_version: {version} '
        'input_map {{ key: "{x}" value: "{a}" }} input_map {{ key: "{y}" value: "{b}" }} '
        'output_map {{ key: "{out}" value: "{to}" }} }}')  # fmt: skip
IO = ('input [ {{ name: "A" data_type: {t} dims: [ 16 ] }}, '
      '{{ name: "B" data_type: {t} dims: [ 16 ] }} ] '
      'output [ {{ name: "SUM" data_type: {t} dims: [ 16 ] }} ]')  # fmt: skip


def _step(a: str = "A", b: str = "B", out: str = "OUTPUT0", to: str = "SUM",
          model: str = "simple", version: int = -1, x: str = "INPUT0",
          y: str = "INPUT1") -> str:  # fmt: skip
    return STEP.format(model=model, version=version, a=a, b=b, out=out, to=to, x=x, y=y)


def _config(name: str = "ens", steps: str | None = None, io: str | None = None,
            extra: str = "", batch: int = 8) -> str:  # fmt: skip
    steps = _step() if steps is None else steps
    io = IO.format(t="TYPE_INT32") if io is None else io
    return (f'name: "{name}" platform: "ensemble" max_batch_size: {batch} {io} {extra} '
            f"ensemble_scheduling {{ step [ {steps} ] }}")  # fmt: skip


def _repository(root: Path, ensembles: dict[str, str], mode: str = "none") -> ModelRepository:
    write_repository(root, ["simple", "simple_sequence"])
    shutil.copytree(root / "simple" / "1", root / "simple" / "2")
    with (root / "simple" / "config.pbtxt").open("a") as config:
        config.write("\nversion_policy: { all {} }\n")
    for name, text in ensembles.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(text)
    settings = Settings(model_repository=root, model_control_mode=mode, access_log=False,
                        load_models="simple")  # fmt: skip
    return ModelRepository(root, settings)


def _reason(repository: ModelRepository, name: str) -> str | None:
    row = next(r for r in repository.index(False) if r["name"] == name)
    return row.get("reason") if row.get("state") != "READY" else None


REFUSED = [
    ("backend", _config(extra='backend: "onnxruntime"'),
     "Ensemble model 'ens' must have platform type 'ensemble' and empty backend type"),
    ("instance group", _config(extra="instance_group [ { kind: KIND_CPU } ]"),
     "instance group should not be specified for ensemble 'ens'"),
    ("warmup", _config(extra='model_warmup [ { name: "w" batch_size: 1 } ]'),
     "model_warmup can not be specified for ensemble 'ens'"),
    ("no steps", _config().replace(_step(), ""), "must specify 'step' for ensemble 'ens'"),
    ("no output map", _config(steps='{ model_name: "simple" input_map { key: "INPUT0" value: '
                                    '"A" } }'),
     "must specify 'output_map' in step 0 of ensemble 'ens'"),
    ("written twice", _config(steps=_step() + "," + _step(out="OUTPUT1")),
     "ensemble tensor 'SUM' can appear in an output map only once for ensemble 'ens' step 1"),
    ("unused input", _config(steps=_step(b="A")), "ensemble input 'B' for ensemble ens' is not "
                                                  "used"),
    ("dangling tensor", _config(steps=_step(to="X") + "," + _step(a="X", b="C")),
     "output 'SUM' for ensemble 'ens' is not written: at least one of its depending tensors, "
     "'C', is not connected"),
    ("unused tensor", _config(steps=_step() + "," + _step(out="OUTPUT1", to="LEFT")),
     "ensemble tensor 'LEFT' is unused in ensemble 'ens'"),
    ("cycle", _config(steps=_step(b="X", to="Y") + "," + _step(a="Y", b="B", to="X") + ","
                      + _step(a="Y", b="X", out="OUTPUT1")),
     "output 'SUM' for ensemble 'ens' is not written: at least one of its depending tensors, "
     "'X', is not connected"),
    ("missing model", _config(steps=_step(model="nowhere")),
     "ensemble ens contains models that are not available or ambiguous: nowhere"),
    ("version not loaded", _config(steps=_step(version=3)),
     "ensemble 'ens' depends on 'simple' whose required version 3 is not loaded."),
    ("type", _config(io=IO.format(t="TYPE_FP32")),
     "in ensemble ens, ensemble tensor A: inconsistent data type: TYPE_FP32 is inferred from "
     "model ens while TYPE_INT32 is inferred from model simple"),
    ("shape", _config(io=IO.format(t="TYPE_INT32").replace("[ 16 ]", "[ 4, 4 ]", 1)),
     "in ensemble ens, ensemble tensor A: inconsistent shape: [-1,4,4] is inferred from model "
     "ens while [-1,16] is inferred from model simple"),
    ("batch", _config(batch=16), "ensemble ens allows maximum batch size 16, but it contains "
                                 "model simple which only allows maximum batch size to be 8"),
    ("unknown input", _config(steps=_step().replace('key: "INPUT1"', 'key: "INPUT9"')),
     "in ensemble ens, ensemble tensor B is mapping to non-existing input INPUT9 in model "
     "simple"),
    ("unknown output", _config(steps=_step(out="OUTPUT9")),
     "in ensemble ens, ensemble tensor SUM is mapped from non-existing output OUTPUT9 in model "
     "simple"),
    ("sequence step", _config(steps=_step(model="simple_sequence")),
     "ensemble 'ens' runs the sequence model 'simple_sequence' as a step"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "config", "reason"), REFUSED, ids=[c[0] for c in REFUSED])
def test_a_refused_ensemble_is_listed_with_tritons_reason(tmp_path: Path, case: str,
                                                          config: str, reason: str) -> None:  # fmt: skip
    repository = _repository(tmp_path, {"ens": config})
    asyncio.run(repository.start())
    found = _reason(repository, "ens")
    assert found is not None and reason in found, found
    assert repository.failed()  # strict readiness: a model the start-up should serve failed


def test_ensembles_load_after_their_steps_whatever_their_names(tmp_path: Path) -> None:
    """ "a_outer" runs "b_inner", which runs "simple": both sort before "simple"."""
    outer = _config("a_outer", _step(model="b_inner", x="A", y="B", out="SUM"))
    inner = _config("b_inner", _step(to="SUM"))
    repository = _repository(tmp_path, {"a_outer": outer, "b_inner": inner})
    asyncio.run(repository.start())
    assert [r["state"] for r in repository.index(False)] == ["READY"] * 5, repository.index(False)
    assert not repository.failed()


def test_circle_of_ensembles(tmp_path: Path) -> None:
    """An ensemble reloaded to run one that runs it is refused with Triton's text."""
    repository = _repository(tmp_path, {"a": _config("a", _step(to="SUM")),
                                        "b": _config("b", _step(model="a", x="A", y="B",
                                                                out="SUM"))}, "explicit")  # fmt: skip

    async def run() -> None:
        await repository.load("simple", None)
        await repository.load("a", None)
        await repository.load("b", None)
        (tmp_path / "a" / "config.pbtxt").write_text(
            _config("a", _step(model="b", x="A", y="B", out="SUM"))
        )
        with pytest.raises(InvalidInput, match=r"load failed for model 'a': circular dependency "
                           r"between ensembles: a -> \.\.\. -> b -> a"):  # fmt: skip
            await repository.load("a", None)
        assert repository.get("a").ready  # a refused load changes nothing

    asyncio.run(run())


def test_explicit_control_an_ensemble_after_its_steps(tmp_path: Path) -> None:
    repository = _repository(tmp_path, {"ens": _config()}, "explicit")

    async def run() -> None:
        with pytest.raises(InvalidInput) as refused:
            await repository.load("ens", None)
        assert str(refused.value) == ("load failed for model 'ens': ensemble ens contains "
                                      "models that are not available or ambiguous: simple")  # fmt: skip
        await repository.load("simple", None)
        await repository.load("ens", None)
        assert repository.get("ens").ready
        await repository.unload("simple")  # takes the ensemble out of service, as Triton
        assert not repository.get("ens").ready
        assert _reason(repository, "ens") == ("ensemble 'ens' depends on 'simple' which has no "
                                              "loaded version.")  # fmt: skip
        await repository.load("simple", None)
        await repository.load("ens", None)
        assert repository.get("ens").ready

    asyncio.run(run())


def test_a_step_model_that_failed_names_its_reason(tmp_path: Path) -> None:
    repository = _repository(tmp_path, {"ens": _config()})
    (tmp_path / "simple" / "1" / "model.onnx").write_bytes(b"garbage")
    (tmp_path / "simple" / "2" / "model.onnx").write_bytes(b"garbage")
    asyncio.run(repository.start())
    found = _reason(repository, "ens")
    assert found is not None
    assert found.startswith("ensemble 'ens' depends on 'simple' which has no loaded version. "
                            "Model 'simple' loading failed with error: "), found  # fmt: skip
