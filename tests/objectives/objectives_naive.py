"""A naive per-token Python-loop reference of every objective, written from the formulas, not the code.

Each token's loss is built from 0-dim tensors indexed out of ``logp`` so that autograd gives the
reference gradient too. Only for tiny tensors.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from satrl.objectives import resolve_objective


def kth(values: list[float], alpha: float) -> float:
    n = len(values)
    k = math.ceil(round(alpha * n, 9))
    return sorted(values)[k - 1] if k >= 1 and n else 0.0


def flat_params(spec) -> dict:
    """The spec's hyperparameters as one flat dict (the KL coefficient as ``kl_coef``), read field by field."""
    p = {}
    for slot in ("ratio", "trust_region", "correction"):
        p.update({k: v for k, v in getattr(spec, slot).model_dump().items() if k != "name"})
    p["kl_coef"] = getattr(spec.kl, "coef", 0.0)
    return p


def naive_policy_loss(name, logp, behavior_logp, adv, mask, ref_logp=None, old_logp=None, lag=None, **overrides):
    resolved = resolve_objective(name, **overrides)
    p = flat_params(resolved)
    # the component names, as strings (the loop below compares them)
    spec = SimpleNamespace(**{slot: getattr(resolved, slot).name
                              for slot in ("ratio", "trust_region", "correction", "kl")})
    B, T = logp.shape
    den = behavior_logp if old_logp is None else old_logp
    old = logp.detach() if old_logp is None else old_logp
    act = [(b, t) for b in range(B) for t in range(T) if mask[b, t]]

    def A(b, t):
        return float(adv[b]) if adv.dim() == 1 else float(adv[b, t])

    # ratio and the log-ratio the trust region sees
    r, dval = {}, {}
    for b in range(B):
        toks = [t for t in range(T) if mask[b, t]]
        if spec.ratio == "token":
            for t in toks:
                r[b, t] = torch.exp(logp[b, t] - den[b, t])
                dval[b, t] = float(logp[b, t].detach() - den[b, t])
        else:
            m = sum(float(logp[b, t].detach() - den[b, t]) for t in toks) / max(len(toks), 1)
            for t in toks:
                r[b, t] = math.exp(m) * torch.exp(logp[b, t] - logp[b, t].detach())
                dval[b, t] = m

    # SAT's contraction factors c- (lower endpoint) and c+ (upper), 1 where it does not act
    c_lo = {bt: 1.0 for bt in act}
    c_hi = {bt: 1.0 for bt in act}
    if spec.trust_region.startswith("sat"):
        q = kth([abs(dval[bt]) for bt in act], p["alpha"])
        for bt in act:
            if q > 0 and abs(dval[bt]) > q:
                c = 1.0 / (1.0 + (abs(dval[bt]) / q) ** p["exponent"])
                if dval[bt] > 0:
                    c_hi[bt] = c
                elif dval[bt] < 0:
                    c_lo[bt] = c
    lo = {bt: 1 - p.get("eps_low", 0.0) * c_lo[bt] for bt in act}
    hi = {bt: 1 + p.get("eps_high", 0.0) * c_hi[bt] for bt in act}
    seq_loss = {}
    if spec.trust_region in ("gmpo", "sat_gmpo"):  # per response: -mean(A) exp(mean_t clipped log r_t)
        for b in range(B):
            toks = [t for t in range(T) if mask[b, t]]
            lcs = []
            for t in toks:
                lr = logp[b, t] - den[b, t]
                if A(b, t) > 0:
                    lcs.append(torch.clamp(lr, max=p["eps_high"] * c_hi[b, t]))
                elif A(b, t) < 0:
                    lcs.append(torch.clamp(lr, min=-p["eps_low"] * c_lo[b, t]))
                else:
                    lcs.append(lr * 0.0)
            if toks:
                seq_loss[b] = -sum(A(b, t) for t in toks) / len(toks) * torch.exp(sum(lcs) / len(toks))
    dropped = set()
    if spec.trust_region == "m2po":  # Algorithm 1, literally: remove the largest d^2 while the mean > tau
        cand = [bt for bt in act if (A(*bt) > 0 and dval[bt] > 0) or (A(*bt) < 0 and dval[bt] < 0)]
        while cand and sum(dval[bt] ** 2 for bt in cand) / len(cand) > p["m2_threshold"]:
            worst = max(cand, key=lambda bt: dval[bt] ** 2)
            cand.remove(worst)
            dropped.add(worst)

    if spec.trust_region == "m2po_official":  # the official repo's loop over breakpoints, with its constants
        bounds = m2po_official_interval([dval[bt] for bt in act], [A(*bt) for bt in act], p)
    if spec.trust_region == "vespo":  # per response: phi of the product of the token ratios pi / mu
        phi = {}
        for b in range(B):
            toks = [t for t in range(T) if mask[b, t]]
            if toks:
                s = sum(min(max(float(logp[b, t].detach() - behavior_logp[b, t]), -20.0), 20.0) for t in toks)
                w = math.exp(min(max(s, -20.0), 20.0))
                pos = sum(A(b, t) for t in toks) / len(toks) >= 0
                k, lam = (p["k_pos"], p["lambda_pos"]) if pos else (p["k_neg"], p["lambda_neg"])
                phi[b] = math.exp(lam + k * math.log(max(w, 1e-8)) - lam * w)

    out = torch.zeros(B, T, dtype=logp.dtype)
    total = logp.sum() * 0.0
    for b, t in act:
        a = A(b, t)
        rr = r[b, t]
        pi, mu = math.exp(float(logp[b, t].detach())), math.exp(float(den[b, t]))
        outward = (a > 0 and pi > mu) or (a < 0 and pi < mu)
        if spec.trust_region in ("cispo", "sat_cispo"):
            loss = -torch.clamp(rr.detach(), lo[b, t], hi[b, t]) * a * logp[b, t]
        elif spec.trust_region == "sapo":
            tau = p["tau_pos"] if a > 0 else p["tau_neg"]
            loss = -(4.0 / tau) * torch.sigmoid(tau * (rr - 1.0)) * a
        elif spec.trust_region in ("gmpo", "sat_gmpo"):
            loss = seq_loss[b]
        elif spec.trust_region == "m2po":
            loss = loss_drop(-rr * a, (b, t) in dropped)
        elif spec.trust_region in ("ppo", "sat", "ppo_dtv_mask"):
            loss = -torch.min(rr * a, torch.clamp(rr, lo[b, t], hi[b, t]) * a)
            if p.get("dual_clip") is not None and a < 0:
                loss = torch.min(loss, torch.tensor(-p["dual_clip"] * a, dtype=logp.dtype))
            if spec.trust_region == "ppo_dtv_mask" and outward and abs(pi - mu) > p["delta"]:
                loss = loss * 0.0
        elif spec.trust_region == "a3po":  # pi_prox interpolated by version (AReaL's loglinear), then decoupled PPO
            ag = int(lag[b, t])
            alpha = 0.0 if ag <= 0 else min(max((ag - p["prox_lag"]) / ag, 0.0), 1.0)
            lmu = float(behavior_logp[b, t])
            lprox = lmu + alpha * (float(logp[b, t].detach()) - lmu)
            rp = torch.exp(logp[b, t] - lprox)
            loss = -torch.min(rp * a, torch.clamp(rp, 1 - p["eps_low"], 1 + p["eps_high"]) * a)
            if p["dual_clip"] is not None and a < 0:
                loss = torch.min(loss, torch.tensor(-p["dual_clip"] * a, dtype=logp.dtype))
            loss = loss * behav_weight(math.exp(lprox - lmu), p)
        elif spec.trust_region == "topr":
            if a > 0:
                loss = -p["topr_positive_weight"] * a * logp[b, t]
            else:
                loss = -p["topr_negative_weight"] * min(max(float(rr.detach()), 0.0), 1.0) * a * logp[b, t]
        elif spec.trust_region == "vespo":
            loss = -phi[b] * a * logp[b, t]
        elif spec.trust_region == "m2po_official":
            loss = -torch.min(rr * a, torch.clamp(rr, *bounds) * a)
        elif spec.trust_region == "dppo_tv":
            loss = loss_drop(-rr * a, outward and abs(pi - mu) > p["delta"])
        else:  # dppo_kl
            kl = mu * math.log(mu / pi) + (1 - mu) * math.log((1 - mu) / (1 - pi))
            loss = loss_drop(-rr * a, outward and kl > p["delta"])

        k = math.exp(float(old[b, t] - behavior_logp[b, t]))
        if spec.correction != "none" and p.get("correction_level") == "sequence":
            toks = [u for u in range(T) if mask[b, u]]
            k = math.exp(sum(float(old[b, u] - behavior_logp[b, u]) for u in toks) / len(toks))
        if spec.correction == "tis":
            loss = loss * min(k, p["tis_cap"])
        elif spec.correction == "icepop":
            loss = loss * (1.0 if p["icepop_low"] <= k <= p["icepop_high"] else 0.0)
        elif spec.correction == "mis":
            loss = loss * (k if k <= p["mis_threshold"] else 0.0)
        elif spec.correction == "decoupled":
            loss = loss * behav_weight(k, p)
        elif spec.correction in ("geo_mask", "kl_mask"):
            loss = loss_drop(loss, not verl_keep(spec.correction, old, behavior_logp, mask, b, t, p))
        elif spec.correction == "opsm":  # drop A < 0 responses whose mean log(mu / pi) exceeds delta
            toks = [u for u in range(T) if mask[b, u]]
            kl = sum(float(behavior_logp[b, u] - logp[b, u].detach()) for u in toks) / len(toks)
            loss = loss_drop(loss, a < 0 and kl > p["opsm_delta"])

        if ref_logp is not None and spec.kl != "none":
            toks = [t] if spec.ratio == "token" else [u for u in range(T) if mask[b, u]]
            kls = [naive_kl(spec.kl, logp[b, u], float(ref_logp[b, u])) for u in toks]
            loss = loss + p["kl_coef"] * sum(kls) / len(kls)
        total = total + loss
        out[b, t] = float(loss.detach())
    return out, total


def loss_drop(loss, drop):
    return loss * 0.0 if drop else loss


def naive_kl(kind, lp, ref):
    x = ref - lp
    if kind == "k1":
        return -x
    if kind == "k2":
        return 0.5 * x * x
    return torch.exp(x) - x - 1.0


def behav_weight(k, p):
    """Decoupled PPO's behaviour weight: k if k <= C else 0 (mask), or min(k, C) (truncate)."""
    cap = p["behav_imp_weight_cap"]
    if p["behav_imp_weight_mode"] == "mask":
        return k if k <= cap else 0.0
    return min(k, cap)


def verl_keep(correction, old, behavior_logp, mask, b, t, p):
    """verl's rejection rule for token (b, t): its own statistic or its response's, against the bounds."""
    kind, level = ("k1", p["geo_level"]) if correction == "geo_mask" else (p["kl_estimator"], p["kl_level"])

    def stat(u):
        lr = min(max(float(old[b, u] - behavior_logp[b, u]), -20.0), 20.0)
        return {"k1": -lr, "k2": 0.5 * lr * lr, "k3": math.exp(lr) - 1.0 - lr}[kind]

    toks = [u for u in range(mask.shape[1]) if mask[b, u]]
    s = {"token": lambda: stat(t), "seq_sum": lambda: sum(stat(u) for u in toks),
         "seq_mean": lambda: sum(stat(u) for u in toks) / len(toks),
         "seq_max": lambda: max(stat(u) for u in toks)}[level]()
    if kind == "k1":
        return math.log(p["geo_low"]) <= s <= math.log(p["geo_high"])
    return s <= p["kl_threshold"]


def m2po_official_interval(ds, advs, p):
    """(lo, hi) of the official M2PO repo (compute_m2po_policy_loss), written as its loop."""
    v = sorted(d * d for d, a in zip(ds, advs) if (a > 1e-12 and math.exp(d) > 1 + 1e-12)
               or (a < -1e-12 and math.exp(d) < 1 - 1e-12))
    n, budget = len(v), p["m2_budget"]
    if n == 0 or sum(v) / n <= budget + 1e-12:
        clip_low, clip_high = 0.0, 100000.0
    else:
        left = 0.0
        for k in range(n):
            left += v[k]
            if (v[k] - 1e-12) * (n - k - 1) + left >= budget * n - 1e-12:
                tau = 0.0 if k == 0 else math.sqrt(max(v[k - 1] - 1e-12, 0.0))
                break
        # the repo takes e^-tau, e^tau of torch.tensor(tau): float32
        clip_low, clip_high = (float(torch.exp(torch.tensor(x, dtype=torch.float32))) for x in (-tau, tau))
    eps_low, eps_high = 1 - clip_low, clip_high - 1
    if p["miniclip_low"] is not None:
        eps_low = max(eps_low, p["miniclip_low"])
    if p["miniclip_high"] is not None:
        eps_high = max(eps_high, p["miniclip_high"])
    return 1 - eps_low, 1 + eps_high
