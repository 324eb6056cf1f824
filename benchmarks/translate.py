"""Translation decoding speed: qkv vs transformers ``generate`` on the same Marian-shaped model.

Legend: B sources per batch, S source length, n new tokens per source, K beams.

A ``MarianMTModel`` with random weights (perturbed away from its init, so that the tokens vary) is
saved to a temporary folder and read by ``qkv.load`` (the Marian converter): the same weights in
both. Each system translates the same batch of B sources of S tokens, greedy and with K = 4 beams,
producing exactly n tokens (the end token is switched off in both), interleaved, after a warm-up;
the medians of tokens/s (B·n over seconds) and the ratio qkv / transformers are printed, and the
tokens must agree.

Sizes: ``--size marian`` (default; opus-mt's shape: d_model 512, 6 + 6 layers, 8 heads, d_ff 2048,
vocab 58101 — several minutes on a 2-core CPU), ``--size small`` (d_model 256, 3 + 3 layers,
vocab 8000). ``--quick``: a tiny model and a few tokens (a smoke run: its timings are noise).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

try:
    import qkv
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import qkv
from qkv.generation.seq2seq import decode  # noqa: E402

SIZES = {
    "tiny": dict(d_model=32, layers=2, heads=4, d_ff=64, vocab=500),
    "small": dict(d_model=256, layers=3, heads=4, d_ff=1024, vocab=8000),
    "marian": dict(d_model=512, layers=6, heads=8, d_ff=2048, vocab=58101),
}


def build_pair(size: str, seed: int = 0):
    """``(transformers MarianMTModel, qkv EncoderDecoder)`` with the same random weights, eval mode."""
    import transformers

    s = SIZES[size]
    torch.manual_seed(seed)
    cfg = transformers.MarianConfig(vocab_size=s["vocab"], d_model=s["d_model"], encoder_layers=s["layers"],
                                    decoder_layers=s["layers"], encoder_attention_heads=s["heads"],
                                    decoder_attention_heads=s["heads"], encoder_ffn_dim=s["d_ff"],
                                    decoder_ffn_dim=s["d_ff"], max_position_embeddings=512, pad_token_id=0,
                                    eos_token_id=None, decoder_start_token_id=0, forced_eos_token_id=None,
                                    dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    hf = transformers.MarianMTModel(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "embed_positions" not in name:  # the sinusoids are fixed
                p.add_(torch.randn(p.shape, generator=g) * 0.05)
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        ours = qkv.load(d).model.eval()
    hf.generation_config.eos_token_id = None
    hf.generation_config.forced_eos_token_id = None
    return hf, ours


@torch.no_grad()
def compare(hf, ours, batch: int, length: int, new: int, beams: int, reps: int) -> dict:
    """tokens/s of both systems on one batch (interleaved, after a warm-up) and whether they agree."""
    ids = torch.randint(1, ours.target_vocab_size, (batch, length), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)

    def run(name):
        if name == "qkv":
            return decode(ours, ids, mask, max_new_tokens=new, num_beams=beams, eos_token_id=None).sequences
        return hf.generate(ids, attention_mask=mask, max_new_tokens=new, num_beams=beams, do_sample=False,
                           min_new_tokens=new)

    agree = run("qkv").tolist() == run("transformers").tolist()  # also the warm-up
    rates = {"qkv": [], "transformers": []}
    for r in range(reps):
        for name in (("qkv", "transformers") if r % 2 == 0 else ("transformers", "qkv")):
            t0 = time.perf_counter()
            run(name)
            rates[name].append(batch * new / (time.perf_counter() - t0))
    q, h = statistics.median(rates["qkv"]), statistics.median(rates["transformers"])
    return {"beams": beams, "batch": batch, "source_len": length, "new_tokens": new, "qkv_tokens_per_s": q,
            "hf_tokens_per_s": h, "ratio_qkv_over_hf": q / h, "tokens_agree": agree}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=tuple(SIZES), default="marian", help="model shape (default marian)")
    p.add_argument("--batch", type=int, default=8, help="sources per batch (default 8)")
    p.add_argument("--source-len", type=int, default=32, help="source tokens (default 32)")
    p.add_argument("--new-tokens", type=int, default=32, help="tokens generated per source (default 32)")
    p.add_argument("--reps", type=int, default=3, help="timed repetitions of each, median taken (default 3)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--quick", action="store_true", help="tiny model, few tokens (a smoke run)")
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.size, args.batch, args.source_len, args.new_tokens, args.reps = "tiny", 2, 6, 4, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    hf, ours = build_pair(args.size)
    print(f"Marian-shaped {args.size} ({sum(p.numel() for p in ours.parameters()) / 1e6:.1f}M params), "
          f"{torch.get_num_threads()} threads, batch {args.batch} × source {args.source_len}, "
          f"{args.new_tokens} new tokens")
    rows = []
    for beams in (1, 4):
        r = compare(hf, ours, args.batch, args.source_len, args.new_tokens, beams, args.reps)
        rows.append(r)
        print(f"{'greedy' if beams == 1 else 'beam 4':>7}: qkv {r['qkv_tokens_per_s']:.1f} tok/s, transformers "
              f"{r['hf_tokens_per_s']:.1f} tok/s, ratio qkv/hf {r['ratio_qkv_over_hf']:.2f}, "
              f"tokens agree: {r['tokens_agree']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"size": args.size, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
