"""``qkv generate MODEL PROMPT [PROMPT …]``: continue text prompts with a causal LM folder.

One prompt streams its continuation to the terminal as it is generated; several are generated
as one left-padded batch and each completion printed at the end.

Library modules are imported inside the command functions, not at the top: ``qkv COMMAND`` builds
only that command's parsers (:data:`qkv.cli._GROUPS`), so a command imports no other command's
library (measured by ``benchmarks/call_path.py``).
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["add_generate_parser"]


def add_generate_parser(sub) -> None:
    p = sub.add_parser(
        "generate",
        help="continue text prompts with a causal language model folder (greedy or sampled)",
        description="Load a causal LM folder (kind causal_lm, with its tokenizer) and continue each prompt. "
        "Sampling is the default (--temperature, --top-k, --top-p, --seed); --greedy takes the most likely "
        "token each step. One prompt is printed as it is generated (unless --no-stream); several prompts are "
        "generated as one batch and printed at the end, one block each. A prompt is encoded without the "
        "tokenizer's end token ([SEP]); its beginning token ([CLS]) is put in front when it has one, and "
        "generation stops at the end token.",
    )
    p.add_argument("model", help="the model folder (qkv causal_lm with a tokenizer)")
    p.add_argument("prompts", nargs="+", metavar="PROMPT", help="text to continue; several are batched")
    p.add_argument("--max-new-tokens", type=int, default=50, help="tokens to add (default 50)")
    p.add_argument("--greedy", action="store_true", help="always take the most likely token (no sampling)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature, > 0 (default 1.0)")
    p.add_argument("--top-k", type=int, default=None, help="sample among the K most likely tokens only")
    p.add_argument("--top-p", type=float, default=None, help="sample in the nucleus of mass P, in (0, 1]")
    p.add_argument("--seed", type=int, default=None, help="seed of the sampler (same seed, same text)")
    p.add_argument("--sliding", action="store_true", help="let the text outgrow the model's window: keep the "
                   "last max_len-1 tokens as context (recomputed each step once full)")
    p.add_argument("--precision", choices=("fp32", "bf16", "int8"), default="fp32",
                   help="decode in float32 (default), bfloat16 (CPUs with AVX-512 BF16 or AMX; half the weight "
                   "bytes per token) or int8 (dynamically quantised linear maps; a quarter); see docs/generation.md")
    p.add_argument("--no-stream", action="store_true", help="print the completion at the end only")
    p.set_defaults(func=_generate)


def _generate(args: argparse.Namespace) -> int:
    from qkv.generation.loop import check_generate, generate
    from qkv.generation.prompts import pad_prompts, prompt_ids, special_ids
    from qkv.generation.sampling import check_sampling
    from qkv.generation.streaming import TextStreamer, continuation
    from qkv.models.causal_lm import CausalLM
    from qkv.validation import MAX_NEW_TOKENS

    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens {args.max_new_tokens}: give at least 1")
    if args.max_new_tokens > MAX_NEW_TOKENS:  # before the model is loaded; --sliding has no window to stop it
        raise ValueError(f"--max-new-tokens {args.max_new_tokens:,} is above {MAX_NEW_TOKENS:,} (the most one "
                         "command may generate); give a smaller number")
    if args.greedy and (args.top_k is not None or args.top_p is not None or args.temperature != 1.0):
        raise ValueError("--greedy takes the most likely token: drop --temperature/--top-k/--top-p, or drop --greedy")
    try:
        check_sampling(args.temperature, args.top_k, args.top_p)
    except ValueError as e:
        raise ValueError(str(e).replace(" or None", "").replace("temperature", "--temperature", 1)
                         .replace("top_k", "--top-k", 1).replace("top_p", "--top-p", 1)) from None
    import qkv

    model, tokenizer = qkv.load(args.model)
    if not isinstance(model, CausalLM):
        raise ValueError(f"{args.model} holds a model of type {type(model).__name__}, not a causal LM: generate needs a model "
                         "folder of kind causal_lm")
    if tokenizer is None:
        raise ValueError(f"{args.model} has no tokenizer (tokenizer.json): generate needs one to read and write text")
    if args.precision != "fp32":
        from qkv.inference import for_inference

        model = for_inference(model, args.precision, smoothing=None)  # refuses bf16 where the CPU lacks it
    _, eos, pad = special_ids(tokenizer)
    prompts = [prompt_ids(tokenizer, t) for t in args.prompts]
    ids, mask = pad_prompts(prompts, pad_token_id=pad if pad is not None else 0)
    try:  # every bad argument is refused before anything is printed
        check_generate(model, ids, mask, args.max_new_tokens, args.temperature, args.top_k, args.top_p,
                       args.sliding)
    except ValueError as e:
        raise ValueError(str(e).replace("sliding=True (CLI: --sliding)", "--sliding")) from None
    stream = len(args.prompts) == 1 and not args.no_stream
    streamer = TextStreamer(tokenizer, eos_token_id=eos, prefix=prompts[0]) if stream else None
    if stream:
        sys.stdout.write(args.prompts[0])
        sys.stdout.flush()
    try:
        out = generate(model, ids, attention_mask=mask, max_new_tokens=args.max_new_tokens,
                       do_sample=not args.greedy, temperature=args.temperature, top_k=args.top_k,
                       top_p=args.top_p, eos_token_id=eos, pad_token_id=pad, seed=args.seed,
                       streamer=streamer, sliding=args.sliding)
    except ValueError as e:
        if stream:
            sys.stdout.write("\n")
        raise ValueError(str(e).replace("sliding=True (CLI: --sliding)", "--sliding")) from None
    if stream:
        streamer.end()
        return 0
    for i, (text, prefix, row) in enumerate(zip(args.prompts, prompts, out)):
        if i:
            print()
        print(f"{text}{continuation(tokenizer, prefix, row[ids.shape[1]:].tolist(), eos)}")
    return 0
