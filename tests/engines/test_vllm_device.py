"""The vLLM engine on a GPU of its own (`engine.kwargs.device: cuda:N`) and the evaluation engine's own
arguments (`eval.engine_kwargs`): the logic runs here without vLLM or a GPU."""

from __future__ import annotations

import pytest

from satrl.config import load_config
from satrl.engines.vllm_engine import pin_visible_device
from satrl.launch.setup import eval_engine_kwargs


@pytest.mark.parametrize(
    ("device", "visible", "pinned"),
    [("cuda:7", None, "7"), ("cuda:1", "4,5,6", "5"), ("cuda", "0,1", "0,1"), (None, "3", "3"), ("cpu", None, None)],
)
def test_cuda_n_narrows_the_visible_devices_to_the_nth_one_this_process_sees(device, visible, pinned):
    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    pin_visible_device(device, env, cuda_started=False)
    assert env.get("CUDA_VISIBLE_DEVICES") == pinned


@pytest.mark.parametrize(
    ("device", "visible", "started", "needle"),
    [("cuda:2", None, True, "CUDA already started"), ("cuda:3", "0,1", False, "sees 2 GPU"),
     ("cuda:x", None, False, "cuda:N")],
)
def test_what_cannot_be_pinned_is_one_line(device, visible, started, needle):
    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    with pytest.raises(ValueError, match=needle) as e:
        pin_visible_device(device, env, cuda_started=started)
    assert "\n" not in str(e.value) and env.get("CUDA_VISIBLE_DEVICES") == visible  # nothing changed


def test_eval_engine_kwargs_default_to_the_rollout_engines_own_and_can_be_given():
    base = ["engine.kwargs={device: 'cuda:7', gpu_memory_utilization: 0.85}"]
    assert eval_engine_kwargs(load_config(None, base)) == {"device": "cuda:7", "gpu_memory_utilization": 0.85}
    own = load_config(None, [*base, "eval.engine_kwargs={gpu_memory_utilization: 0.2}"])
    assert eval_engine_kwargs(own) == {"gpu_memory_utilization": 0.2}
    assert own.model_dump(mode="json")["eval"]["engine_kwargs"] == {"gpu_memory_utilization": 0.2}  # saved
    assert eval_engine_kwargs(load_config(None, ["eval.engine_kwargs={}"])) == {}
