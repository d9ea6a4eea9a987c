import argparse
import json
import math
import re

import pytest
import torch

from satrl.apps.eval import add_eval_args, run_eval
from satrl.tasks import ArithmeticOptions, ArithmeticTask
from satrl.tasks.evaluate import EvalResult, evaluate
from satrl.types import Completion, Engine, SamplingParams, request_seed


class CharTok:
    """Stand-in tokenizer: one id per character, plus a BOS id 0 like the char tokenizer."""

    def __call__(self, text):
        return {"input_ids": [0] + [ord(c) for c in text]}


def _prompt(ids):
    return "".join(chr(i) for i in ids[1:])


class ScriptedEngine:
    """Fake engine: for each prompt, returns scripted sampled texts in order, and a scripted greedy text."""

    def __init__(self, sampled, greedy):
        self.sampled, self.greedy = sampled, greedy
        self.served = {p: 0 for p in sampled}
        self.calls = []  # (requests, sampling) per generate call

    @property
    def version(self):
        return 0

    def load_weights(self, state_dict, version):
        raise NotImplementedError

    def generate(self, requests, sampling):
        self.calls.append((list(requests), sampling))
        out = []
        for r in requests:
            p = _prompt(r.prompt_ids)
            if sampling.greedy:
                text = self.greedy[p]
            else:
                text = self.sampled[p][self.served[p]]
                self.served[p] += 1
            out.append(Completion(r.request_id, r.prompt_ids, [1], text, torch.zeros(1), "stop", 0))
        return out


def _three_problems():
    task = ArithmeticTask(ArithmeticOptions(digits=2, ops="+", n_eval=3))
    probs = list(task.problems("eval", 0))
    return task, probs


def _scripted(probs):
    a, b, c = probs
    sampled = {
        a.prompt: [a.answer] * 4,  # 4/4
        b.prompt: ["x", b.answer, " " + b.answer, b.answer + "0"],  # 1/4 (strict format)
        c.prompt: ["", "1", "2", "3"] if c.answer not in "123" else ["", "", "", ""],  # 0/4
    }
    greedy = {a.prompt: "wrong", b.prompt: b.answer, c.prompt: c.answer}
    return ScriptedEngine(sampled, greedy)


def test_avg_at_k_and_greedy_against_hand_computed_values():
    task, probs = _three_problems()
    engine = _scripted(probs)
    assert isinstance(engine, Engine)
    res = evaluate(engine, CharTok(), task, k=4)
    assert isinstance(res, EvalResult)
    assert res.per_problem == [1.0, 0.25, 0.0]
    assert math.isclose(res.avg_at_k, (1 + 0.25 + 0) / 3)
    assert math.isclose(res.greedy_acc, 2 / 3)
    assert math.isclose(res.pass_at_k, 2 / 3)
    assert (res.k, res.n_problems, res.split, res.seed) == (4, 3, "eval", 0)
    assert res.greedy == [0.0, 1.0, 1.0]
    d = res.as_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["sampling"] == {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 16, "greedy": False}
    assert "per_problem" not in d


def test_requests_prompts_seeds_and_sampling():
    task, probs = _three_problems()
    engine = _scripted(probs)
    sampling = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=5)
    res = evaluate(engine, CharTok(), task, k=4, sampling=sampling, seed=11, batch_size=5)
    assert res.sampling["temperature"] == 0.7 and res.sampling["top_p"] == 0.9
    reqs = [r for rs, _ in engine.calls for r in rs]
    assert all(len(rs) <= 5 for rs, _ in engine.calls)
    assert len(reqs) == 3 * 4 + 3
    # prompt ids are the tokenizer's ids, as is
    assert {tuple(r.prompt_ids) for r in reqs} == {tuple(CharTok()(p.prompt)["input_ids"]) for p in probs}
    # greedy calls are greedy with the same other settings; sampled calls are not greedy
    greedy_calls = [s for _, s in engine.calls if s.greedy]
    assert greedy_calls and all(s.max_new_tokens == 5 and s.top_p == 0.9 for s in greedy_calls)
    assert sum(len(rs) for rs, s in engine.calls if not s.greedy) == 12
    # per-request seeds: distinct, derived from (seed, problem, sample), same for any batch size
    seeds = [r.seed for r in reqs]
    assert len(set(seeds)) == len(seeds)
    expected = {request_seed("eval", 11, i, j) for i in range(3) for j in [*range(4), -1]}
    assert set(seeds) == expected
    engine2 = _scripted(probs)
    evaluate(engine2, CharTok(), task, k=4, sampling=sampling, seed=11, batch_size=256)
    assert sorted((r.request_id, r.seed) for rs, _ in engine2.calls for r in rs) == sorted(
        (r.request_id, r.seed) for r in reqs
    )
    assert len(engine2.calls) == 2  # one sampled batch, one greedy batch


def test_request_seed_is_deterministic_and_distinct():
    assert request_seed("eval", 0, 1, 2) == request_seed("eval", 0, 1, 2)
    seeds = {request_seed("eval", s, i, j) for s in range(3) for i in range(20) for j in range(-1, 8)}
    assert len(seeds) == 3 * 20 * 9
    assert all(0 <= s < 2**63 for s in seeds)
    rollout = {request_seed("rollout", s, b, g, i) for s in range(2) for b in range(5) for g in range(4) for i in range(3)}
    assert len(rollout) == 2 * 5 * 4 * 3 and all(0 <= s < 2**62 for s in rollout) and not rollout & seeds
    with pytest.raises(ValueError, match="valid choices"):
        request_seed("train", 0, 1, 2)


def test_n_problems_and_bad_arguments():
    task, probs = _three_problems()
    res = evaluate(_scripted(probs), CharTok(), task, k=4, n_problems=2)
    assert res.per_problem == [1.0, 0.25] and math.isclose(res.avg_at_k, 0.625)
    with pytest.raises(ValueError, match="only 3 eval problems"):
        evaluate(_scripted(probs), CharTok(), task, k=4, n_problems=5)
    with pytest.raises(ValueError, match="n_problems"):
        evaluate(_scripted(probs), CharTok(), task, split="train")
    with pytest.raises(ValueError, match="k must be"):
        evaluate(_scripted(probs), CharTok(), task, k=0)
    with pytest.raises(ValueError, match="greedy"):
        evaluate(_scripted(probs), CharTok(), task, sampling=SamplingParams(greedy=True))


# --------------------------------------------------------------------------- real engine and model
models = pytest.importorskip("satrl.models")
engines = pytest.importorskip("satrl.engines")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    torch.set_num_threads(1)
    tok = models.build_char_tokenizer()
    model = models.build_tiny_model("dense", vocab_size=len(tok), seed=0)
    out = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def test_real_engine_is_deterministic_and_batch_invariant(tiny_dir):
    model, tok = models.load_policy(str(tiny_dir))
    engine = engines.TorchEngine(model, engines.EngineSpec(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tokenizer=tok, numerics="fp32"))
    task = ArithmeticTask(ArithmeticOptions(digits=3, n_eval=6))
    sampling = SamplingParams(max_new_tokens=6)
    a = evaluate(engine, tok, task, k=3, sampling=sampling, seed=1, batch_size=256)
    b = evaluate(engine, tok, task, k=3, sampling=sampling, seed=1, batch_size=4)
    assert a.per_problem == b.per_problem and a.greedy == b.greedy
    assert all(x * 3 in (0, 1, 2, 3) for x in a.per_problem)
    assert 0.0 <= a.avg_at_k <= 1.0 and a.n_problems == 6


def _args(*argv):
    parser = argparse.ArgumentParser()
    add_eval_args(parser)
    return parser.parse_args(list(argv))


def test_cli_prints_avg_and_greedy(tiny_dir, capsys):
    rc = run_eval(_args("--model", str(tiny_dir), "--task", "arithmetic", "--k", "2", "--n-problems", "3",
                        "--task-arg", "digits=2", "--max-new-tokens", "4", "--json"))
    out = capsys.readouterr().out.splitlines()
    assert rc == 0
    assert re.fullmatch(r"avg@2 = [01]\.\d{3}", out[0])
    assert re.fullmatch(r"greedy_acc = [01]\.\d{3}", out[1])
    record = json.loads(out[-1])
    assert record["k"] == 2 and record["n_problems"] == 3 and record["sampling"]["max_new_tokens"] == 4
    assert f"{record['avg_at_k']:.3f}" == out[0].split(" = ")[1]


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--task", "nosuchtask"], "unknown task 'nosuchtask'; valid choices"),
        (["--task-arg", "digit=3"], "bad arguments for task 'arithmetic'"),
        (["--task-arg", "digits"], "KEY=VALUE"),
        (["--numerics", "fp8"], "unknown numerics"),
        (["--temperature", "0"], "temperature"),
        (["--n-problems", "100000"], "only 200 eval problems"),
    ],
)
def test_cli_bad_inputs_exit_2_with_one_line(tiny_dir, capsys, argv, match):
    rc = run_eval(_args("--model", str(tiny_dir), *argv))
    err = capsys.readouterr().err
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and match in err


def test_cli_missing_model_dir(tmp_path, capsys):
    rc = run_eval(_args("--model", str(tmp_path / "no-such-model")))
    err = capsys.readouterr().err
    assert rc == 2 and "no-such-model" in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------------------- val / test split
def test_val_test_parts_are_disjoint_deterministic_and_cover_every_problem():
    from satrl.tasks.evaluate import part_of, split_val_test

    task = ArithmeticTask(ArithmeticOptions(digits=3, n_eval=1000))
    problems = list(task.problems("eval", 0))
    parts = [part_of(p) for p in problems]
    assert set(parts) == {"val", "test"} and 0.45 < parts.count("val") / len(parts) < 0.55
    # the same problem lands in the same part whatever the order, the seed of the draw or the process
    assert [part_of(p) for p in reversed(problems)] == parts[::-1]
    other = ArithmeticTask(ArithmeticOptions(digits=3, n_eval=1000, eval_seed=7))
    again = {p.prompt: part_of(p) for p in other.problems("eval", 0)}
    assert all(again[p.prompt] == part for p, part in zip(problems, parts) if p.prompt in again)
    pool, val, test = split_val_test(problems, 30, 40)
    assert len(val) == 30 and len(test) == 40 and sorted(val + test) == list(range(70))  # each once
    assert {pool[i].prompt for i in val}.isdisjoint({pool[i].prompt for i in test})
    assert all(part_of(pool[i]) == "val" for i in val) and all(part_of(pool[i]) == "test" for i in test)
    assert [p.prompt for p in pool] == [p.prompt for p in problems if p in pool]  # original order kept
    assert split_val_test(problems, 30, 40) == (pool, val, test)
    # a different key is a different (still disjoint) partition
    assert [part_of(p, key="other") for p in problems] != parts
    with pytest.raises(ValueError, match="eval.val_problems=600"):
        split_val_test(problems, 600, 10)


def test_part_scores_hand_values():
    from satrl.tasks.evaluate import part_scores

    r = EvalResult(avg_at_k=0.0, greedy_acc=0.0, pass_at_k=0.0, k=2, n_problems=3, sampling={},
                   per_problem=[0.5, 1.0, 0.0], greedy=[1.0, 1.0, 0.0], hit=[1.0, 1.0, 0.0])  # fmt: skip
    assert part_scores(r, [0, 2]) == {"avg_at_k": 0.25, "greedy_acc": 0.5, "pass_at_k": 0.5}
    assert part_scores(r, [1]) == {"avg_at_k": 1.0, "greedy_acc": 1.0, "pass_at_k": 1.0}
