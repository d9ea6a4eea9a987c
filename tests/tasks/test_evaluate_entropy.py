"""The sampled entropy of `satrl.tasks.evaluate` (the mean -log mu of the sampled response tokens): by hand on a
scripted engine, against the exact entropy of a tiny model's next-token distribution, and in `satrl eval`'s output."""

import json
import math

import torch
from test_evaluate import CharTok, ScriptedEngine, _args, _three_problems

from satrl import engines, models
from satrl.apps.eval import run_eval
from satrl.tasks import ArithmeticOptions, ArithmeticTask
from satrl.tasks.evaluate import evaluate
from satrl.types import Completion, SamplingParams


class LogpEngine(ScriptedEngine):
    """The scripted engine, each sampled text answered with one token per character at log mu = -0.5 per token
    (its greedy answers at -9, which must not count)."""

    def generate(self, requests, sampling):
        out = []
        for c in super().generate(requests, sampling):
            n = max(len(c.text), 1)
            logp = torch.full((n,), -9.0 if sampling.greedy else -0.5)
            out.append(Completion(c.request_id, c.prompt_ids, [1] * n, c.text, logp, "stop", 0))
        return out


def test_sampled_entropy_by_hand():
    task, (a, b, c) = _three_problems()
    sampled = {a.prompt: ["12", "345", "6", "78"], b.prompt: ["1"] * 4, c.prompt: ["", "", "", "9999"]}
    greedy = {p.prompt: "x" for p in (a, b, c)}
    res = evaluate(LogpEngine(sampled, greedy), CharTok(), task, k=4)
    # tokens: 2+3+1+2 = 8, 4, 1+1+1+4 = 7 (an empty text is one token here); -log mu = 0.5 each
    assert res.sampled_tokens == [8, 4, 7] and res.sampled_nll == [4.0, 2.0, 3.5]
    assert res.sampled_entropy == 0.5 and "sampled_nll" not in res.as_dict()  # as_dict (pretrain.json) unchanged


def test_sampled_entropy_estimates_the_exact_entropy_of_the_next_token(tmp_path):
    """One new token per sample, 1000 samples of one prompt: the estimate is within 4 standard errors of the exact
    entropy of the model's next-token distribution at temperature 1, computed from its logits by hand."""
    torch.manual_seed(0)
    tok = models.build_char_tokenizer()
    model = models.build_tiny_model("dense", vocab_size=len(tok), seed=0).eval()
    task = ArithmeticTask(ArithmeticOptions(digits=2, n_eval=1))
    spec = engines.EngineSpec(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tokenizer=tok,
                              numerics="fp32")  # fmt: skip
    k = 1000
    res = evaluate(engines.TorchEngine(model, spec), tok, task, k=k, sampling=SamplingParams(max_new_tokens=1))
    assert res.sampled_tokens == [k]
    (problem,) = task.problems("eval", 0)
    with torch.no_grad():
        logits = model(torch.tensor([tok(problem.prompt)["input_ids"]])).logits[0, -1].double()
    logp = torch.log_softmax(logits, -1)
    exact = float(-(logp.exp() * logp).sum())
    sd = float((logp.exp() * (logp + exact) ** 2).sum().sqrt())  # of -log mu(y) under mu
    assert abs(res.sampled_entropy - exact) < 4 * sd / math.sqrt(k), (res.sampled_entropy, exact, sd)


def test_satrl_eval_prints_and_records_it(tmp_path, capsys):
    tok = models.build_char_tokenizer()
    models.build_tiny_model("dense", vocab_size=len(tok), seed=0).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    assert run_eval(_args("--model", str(tmp_path), "--task", "arithmetic", "--k", "2", "--n-problems", "3",
                          "--task-arg", "digits=2", "--max-new-tokens", "4", "--json")) == 0  # fmt: skip
    out = capsys.readouterr().out.splitlines()
    line = next(x for x in out if x.startswith("sampled entropy = "))
    record = json.loads(out[-1])
    assert line.startswith(f"sampled entropy = {record['sampled_entropy']:.4f} nats/token (mean -log mu over the ")
    assert record["sampled_entropy"] > 0
