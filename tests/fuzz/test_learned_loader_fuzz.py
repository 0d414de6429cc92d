"""The learned-policy loader never unpickles and refuses any malformed artifact with one line.

A real artifact is exported from an untrained MaskablePPO (``agents.export.export_policy``); then its
``weights.safetensors`` is replaced by a working pickle whose ``__reduce__`` would create a marker file (it is
refused, the marker never appears), and its weights and manifest are fuzzed with hypothesis.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sb3_contrib import MaskablePPO

from agents.export import export_policy
from policies.learned import MANIFEST_NAME, WEIGHTS_NAME, LearnedPolicy, PolicyLoadError
from tests.agents.test_export import LAYOUT, _SpacesOnly


class _Payload:
    """Unpickling this calls ``Path.touch`` on the marker: proof that a pickle was executed."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return Path.touch, (str(self.marker),)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = MaskablePPO("MlpPolicy", _SpacesOnly(), policy_kwargs={"net_arch": [16]}, seed=0, device="cpu")
    out = export_policy(model, tmp_path_factory.mktemp("artifact"), LAYOUT, tenants=("chat", "rag"), groups=("g",))
    LearnedPolicy.load(out)  # the untouched export loads
    return out


def _copy(artifact: Path, tmp: Path) -> Path:
    target = tmp / "copy"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(artifact, target)
    return target


def _refused(path: Path) -> str:
    with pytest.raises(PolicyLoadError) as info:
        LearnedPolicy.load(path)
    message = str(info.value)
    assert "\n" not in message
    return message


def _load_or_refuse(path: Path) -> None:
    """Loads, or raises :class:`PolicyLoadError` with a one-line message; any other exception fails the test."""
    message = ""
    try:
        LearnedPolicy.load(path)
    except PolicyLoadError as exc:
        message = str(exc)
    assert "\n" not in message


def test_a_working_pickle_named_weights_safetensors_is_refused_unexecuted(artifact: Path, tmp_path: Path) -> None:
    marker = tmp_path / "executed"
    assert pickle.loads(pickle.dumps(_Payload(tmp_path / "probe"))) is None  # the payload does run when unpickled
    assert (tmp_path / "probe").exists()
    target = _copy(artifact, tmp_path)
    for protocol in (0, 2, pickle.HIGHEST_PROTOCOL):
        (target / WEIGHTS_NAME).write_bytes(pickle.dumps(_Payload(marker), protocol=protocol))
        assert "not a safetensors file" in _refused(target)
        assert not marker.exists()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 4000), junk=st.binary(max_size=64), flip=st.integers(0, 4000))
def test_mangled_weights_are_refused_or_load(artifact: Path, tmp_path: Path, cut: int, junk: bytes, flip: int) -> None:
    target = _copy(artifact, tmp_path)
    good = (artifact / WEIGHTS_NAME).read_bytes()
    data = bytearray(good[: min(cut, len(good))] + junk + good[min(cut, len(good)) :])
    if data:
        data[flip % len(data)] ^= 0xFF
    (target / WEIGHTS_NAME).write_bytes(bytes(data))
    _load_or_refuse(target)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
    max_leaves=10,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(index=st.integers(0, 63), value=json_values, drop=st.booleans())
def test_mangled_manifests_are_refused_or_load(
    artifact: Path, tmp_path: Path, index: int, value: object, drop: bool
) -> None:
    target = _copy(artifact, tmp_path)
    manifest = json.loads((artifact / MANIFEST_NAME).read_text())
    keys = sorted(manifest)
    name = keys[index % len(keys)] if index < 60 else "unknown_key"
    if drop:
        manifest.pop(name, None)
    else:
        manifest[name] = value
    (target / MANIFEST_NAME).write_text(json.dumps(manifest))
    _load_or_refuse(target)
