"""`moekda generate`: text from a character model, generated on the chip's RTL simulation.

    moekda generate -c model-small --image build/demo/model-small-chars/image.bin --prompt "def " -n 32

The prompt's bytes (UTF-8) are streamed into the chip as one sequence; each next byte the
chip gives (its on-chip argmax: greedy decoding) is fed back as its next input, ``-n``
times.  Prints the prompt and the generated text, checks every byte against the integer
model fed the same bytes, and prints the chip's cycles per token.  A model with a byte
vocabulary (model.vocab = 256: model/tasks/chars.py) is needed; for other vocabularies,
``moekda run --prompt-ids`` generates token ids.
"""
from __future__ import annotations

from pathlib import Path

from cli import UserError

MAX_NEW = 4096


def configure(p):
    p.add_argument("--image", required=True, help="memory image of a character model (moekda image, moekda demo)")
    p.add_argument("--prompt", required=True, help="the text the generation starts from (UTF-8)")
    p.add_argument("-n", "--tokens", type=int, default=32, help=f"bytes to generate (1 to {MAX_NEW}; default 32)")
    p.add_argument("--sim", choices=("verilator", "icarus"), default="verilator", help="RTL simulator (default verilator)")


def run(args) -> int:
    from moekda.config import load_config
    cfg = load_config(args.config)
    if cfg.model.vocab != 256:
        raise UserError(f"-c {cfg.name}: model.vocab is {cfg.model.vocab}; generating text needs a byte "
                        f"vocabulary of 256 (model-small); use `moekda run --prompt-ids` for token ids")
    if not 1 <= args.tokens <= MAX_NEW:
        raise UserError(f"--tokens {args.tokens}: allowed range is 1 to {MAX_NEW}")
    prompt = list(args.prompt.encode("utf-8"))
    if not prompt:
        raise UserError("--prompt: empty; allowed is text of one byte or more")
    if not Path(args.image).is_file():
        raise UserError(f"--image {args.image}: no such file")
    from hw.image.format import ImageError
    from run.driver import ModelDriver
    from model.tasks.chars import text_of
    try:
        drv = ModelDriver.from_image(args.config, args.image)
    except ImageError as e:
        raise UserError(str(e)) from None
    print(f"moekda generate: {cfg.name}, {len(prompt)} prompt bytes, {args.tokens} new, {args.sim}", flush=True)
    res, got, want = drv.generate(prompt, args.tokens, simulator=args.sim)
    print(f"prompt:    {args.prompt!r}")
    print(f"generated: {text_of(got)!r}")
    same = res.match and got == want
    print(("the integer model generates the same bytes" if same else
           f"MISMATCH: the integer model generates {text_of(want)!r}"))
    print(f"cycles per token {res.cycles_per_token:,.0f} (busy cycles / tokens, prompt and generation, "
          f"one sequence)")
    for p in res.problems[:5]:
        print(f"  {p}")
    return 0 if same else 1
