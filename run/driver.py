"""LayerDriver: one quantised model through the layer chip's RTL (cocotb) and the integer model.

    drv = LayerDriver.from_seed("tiny", seed=0)            # quantise a seeded random layer
    drv = LayerDriver.from_vectors("build/tiny/vectors")    # or a `moekda vectors` export
    res = drv.run(RunPlan(tokens=256, clears=(100,), reset_at=180), simulator="verilator")
    res.match, res.cycles_per_token, res.counters

The chip's Verilog is a function of the config alone (hw/chip/layer.py LayerTop);
the model is the memory image (hw/image/format.py) the bench writes into the
sim top's weight memory and the chip LOADs at the start of every run (and
after a reset).  One simulator build per (chip sources, simulator) under
<build_root>/sim/layer/ serves every model (build_root: build/<config>/ by
default; the sweep gives each point its own).
The simulated top is sim/hdl/layer_sim.py: the chip plus the weight memory in
the HDL, so no Python runs per clock cycle.
A run hands the bench (sim/cocotb/tb_layer.py) one .npz with the weight
image, the tokens and the plan, and gets back one .npz with every output
token it saw (with its input index), the CSR counters and the cycle counts;
the comparison with the integer model is done here.

``netlist=`` runs the same bench on a gate-level netlist instead (Icarus with
the kit's cell models): the netlist of `moekda synth --top layer`, for any model.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from moekda.config import REPO_ROOT, Config, load_config
from sim.cocotb_util import ICARUS_ARGS

# with only the sim top public (VERILATOR_PUBLIC) Verilator can optimise the chip
# (-O3) and its C++ stays small enough for a quick -O1 compile with split functions:
# tiny builds in ~30 s and runs ~230k cycles/s (C++ -O0: ~48k) on the loaded machine
VERILATOR_ARGS = ["-Wno-fatal", "-Wno-WIDTH", "-Wno-UNOPTFLAT", "-O3", "-CFLAGS", "-O1",
                  "--output-split-cfuncs", "2000", "--x-assign", "0", "--x-initial", "0"]
# cocotb's runner makes every Verilator signal public (--public-flat-rw), which keeps
# the chip's thousands of internal nets as separate, unoptimised variables; the layer
# bench touches only the sim top's ports, so only those are made public (a control file)
# an activity build (LayerDriver.activity): the SAIF writer, and every net, the netlist's
# _123_ ones too (Verilator leaves names that start with _ out of its traces by default)
SAIF_ARGS = ["--trace-saif", "--trace-underscore"]
VERILATOR_PUBLIC = '`verilator_config\npublic_flat_rw -module "layer_sim" -var "*"\n'


@dataclass
class RunPlan:
    """What a run does besides streaming ``tokens`` tokens.

    ``first``: tokens sent with the stream's ``first`` bit; ``clears``: tokens before
    which the bench writes CTRL.CLEAR (after the previous token was taken);
    ``reset_at``: tokens reset_at .. reset_at+abandon-1 are sent and the chip is
    reset while they are inside (their outputs may or may not come out before the
    reset); streaming then resumes at reset_at+abandon, which must start a new
    sequence by itself (the chip's clear-after-reset).  ``stall``: random stalls on
    both token streams and on the weight port (both directions)."""
    tokens: int
    first: tuple = (0,)
    clears: tuple = ()
    reset_at: int | None = None
    abandon: int = 2
    stall: bool = True
    seed: int = 0
    token_cycles: tuple = ()        # tokens after whose output the bench reads TOKEN_CYCLES (a bus
                                    # read per token halves Verilator's speed: only those asked for)
    bad_images: tuple = ()          # damage kinds (model.image.DAMAGE_KINDS) LOADed and refused
                                    # before the good image
    slots: tuple = ()               # the sequence slot of each token (a model chip with hw.sequences
                                    # > 1); empty: token t in slot t mod S

    def __post_init__(self):
        if self.tokens < 1:
            raise ValueError("RunPlan.tokens must be >= 1")
        if self.reset_at is not None and not 1 <= self.reset_at <= self.tokens - self.abandon - 1:
            raise ValueError(f"RunPlan.reset_at = {self.reset_at}: must be in 1..{self.tokens - self.abandon - 1}")

    @property
    def resumed(self) -> int | None:
        return None if self.reset_at is None else self.reset_at + self.abandon

    def model_resets(self) -> np.ndarray:
        """Where the integer model's state is cleared: every way the chip starts a sequence."""
        r = np.zeros(self.tokens, bool)
        r[0] = True
        for t in (*self.first, *self.clears):
            if t < self.tokens:
                r[t] = True
        if self.resumed is not None:
            r[self.resumed] = True
        return r

    def slot_of(self, S: int) -> np.ndarray:
        """The sequence slot of each token."""
        if self.slots:
            if len(self.slots) != self.tokens or not all(0 <= s < S for s in self.slots):
                raise ValueError(f"RunPlan.slots: one slot (0 to {S - 1}) per token")
            return np.array(self.slots, np.int64)
        return np.arange(self.tokens) % S

    def slot_sequences(self, S: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per sequence slot: the indices of its tokens and where its sequence (re)starts (its
        ``model_resets``): the slot's first token, a token sent with ``first`` (its own slot
        only), and the slot's first token after a CLEAR or the restart after a reset, which
        reach every slot (every slot's sequence rule on the chip).  S = 1: model_resets."""
        if S == 1:
            return [(np.arange(self.tokens), self.model_resets())]
        every = sorted({*(t for t in self.clears if t < self.tokens),
                        *(() if self.resumed is None else (self.resumed,))})
        firsts = set(self.first)
        slot = self.slot_of(S)
        out = []
        for s in range(S):
            ts = np.flatnonzero(slot == s)
            r = np.zeros(len(ts), bool)
            prev = -1
            for k, t in enumerate(ts):
                r[k] = k == 0 or t in firsts or any(prev < c <= t for c in every)
                prev = t
            out.append((ts, r))
        return out

    def required(self) -> np.ndarray:
        """Tokens whose output must appear (the abandoned ones may be lost to the reset)."""
        req = np.ones(self.tokens, bool)
        if self.reset_at is not None:
            req[self.reset_at:self.resumed] = False
        return req


@dataclass
class RunResult:
    want: np.ndarray                    # (T, d) integer model
    idx: np.ndarray                     # (K,) input index of each output the chip gave, by its tag
    got: np.ndarray                     # (K, d)
    counters: dict                      # CSR counters at the end (since the last reset)
    token_cycles: np.ndarray            # TOKEN_CYCLES after the outputs of plan.token_cycles (else the last)
    wall_s: float
    problems: list = field(default_factory=list)
    waves: Path | None = None           # the waveform file when recorded
    out_cycles: np.ndarray | None = None  # clock cycle of each output (bench time)
    sim_cycles: int = 0                 # clock cycles the simulator ran (build excluded)
    sim_s: float = 0.0                  # the simulator's wall time for them
    token_cycles_idx: np.ndarray | None = None   # the token of each token_cycles value
    load_cycles: np.ndarray | None = None        # LOAD_CYCLES of each good LOAD (one, or two with a reset)
    tags: np.ndarray | None = None               # the chip's tag (sequence position) of each output

    @property
    def cycles_per_s(self) -> float | None:
        """Simulation speed: clock cycles per wall-clock second of the run itself."""
        return self.sim_cycles / self.sim_s if self.sim_s > 0 else None

    @property
    def match(self) -> bool:
        return not self.problems

    @property
    def cycles_per_token(self) -> float:
        """BUSY_CYCLES / TOKENS over the part after the last reset (pipeline fill included)."""
        return self.counters.get("BUSY_CYCLES", 0) / max(1, self.counters.get("TOKENS", 0))

    @property
    def token_interval(self) -> float | None:
        """Steady-state cycles between output tokens: the median gap over the second half
        of the run (the throughput figure; meaningful without stalls)."""
        if self.out_cycles is None or len(self.out_cycles) < 4:
            return None
        gaps = np.diff(self.out_cycles[len(self.out_cycles) // 2:])
        return float(np.median(gaps))

    def summary(self) -> str:
        c = self.counters
        head = "MATCH" if self.match else f"MISMATCH ({len(self.problems)} problems; first: {self.problems[0]})"
        interval = self.token_interval
        return (f"{head}: {len(self.idx)} output tokens of {len(self.want)} inputs checked\n"
                + (f"steady state: one token every {interval:.0f} cycles\n" if interval else "")
                + (f"LOAD: {int(self.load_cycles[0])} cycles\n" if self.load_cycles is not None
                   and len(self.load_cycles) else "")
                + f"cycles/token {self.cycles_per_token:.1f} (busy cycles / tokens), last token "
                f"{int(self.token_cycles[-1]) if len(self.token_cycles) else 0} cycles\n"
                f"counters: " + ", ".join(f"{k}={v}" for k, v in c.items()) + f"\nwall time {self.wall_s:.1f} s"
                + (f" (simulation {self.sim_cycles} cycles in {self.sim_s:.1f} s: "
                   f"{self.cycles_per_s:,.0f} cycles/s)" if self.cycles_per_s else "")
                + (f"\nwaveforms: {self.waves}" if self.waves else ""))


def sequence_positions(plan: RunPlan, S: int = 1) -> np.ndarray:
    """Each input token's position in its sequence: the tag the chip must give its output
    (hw/chip/layer.py token_out_layout, before the wrap at 2**SEQ_BITS); with S sequence
    slots, in its slot's sequence (plan.slot_sequences)."""
    pos = np.zeros(plan.tokens, np.int64)
    for ts, starts in plan.slot_sequences(S):
        for k in range(1, len(ts)):
            pos[ts[k]] = 0 if starts[k] else pos[ts[k - 1]] + 1
    return pos


def tag_indices(plan: RunPlan, tags, resets: np.ndarray | None = None) -> tuple[np.ndarray, list[str]]:
    """The input index of each output by the chip's own tags (its position in its sequence):
    a tag 0 starts the next sequence of the plan (unless it is the wrap of a sequence
    longer than 2**SEQ_BITS), any other tag q is token q of the current sequence.  So a
    duplicated or reordered output shows as indices that do not increase (compare), and a
    tag beyond its sequence or a sequence that starts where the plan has none is a problem.
    ``resets``: the sequence starts of one slot's tokens instead of the plan's (indices are
    then positions among that slot's tokens)."""
    from hw.chip.layer import SEQ_BITS
    wrap = 1 << SEQ_BITS
    resets = plan.model_resets() if resets is None else resets
    starts = [int(t) for t in np.flatnonzero(resets)] + [len(resets)]
    idx, problems = [], []
    si, block, prev = -1, 0, None
    for k, q in enumerate(int(v) for v in tags):
        if q == 0 and not (prev is not None and si >= 0 and (prev - starts[si] + 1) % wrap == 0
                           and prev + 1 < starts[si + 1]):
            si, block = si + 1, 0
        elif q == 0:
            block += wrap
        if si < 0 or si >= len(starts) - 1:
            problems.append(f"output {k}: tag {q} " + ("before any sequence started (no tag 0)" if si < 0
                                                       else "starts a sequence the inputs do not"))
            si = max(si, 0) if si < 0 else len(starts) - 2
            idx.append(-1 if prev is None else prev)
            continue
        t = starts[si] + block + q
        if t >= starts[si + 1]:
            problems.append(f"output {k}: tag {q} beyond its sequence (tokens {starts[si]}.."
                            f"{starts[si + 1] - 1})")
        idx.append(t)
        prev = t
    return np.array(idx, np.int64), problems


def slot_tag_indices(plan: RunPlan, tags, slots, S: int) -> tuple[np.ndarray, list[str]]:
    """tag_indices of a chip with S sequence slots: each output's slot and tag place it among
    its slot's tokens (plan.slot_sequences), in order within the slot, any order across."""
    idx, problems = np.full(len(tags), -1, np.int64), []
    tags, slots = np.asarray(tags, np.int64), np.asarray(slots, np.int64)
    for s, (ts, r) in enumerate(plan.slot_sequences(S)):
        sel = np.flatnonzero(slots == s)
        if not len(sel):
            continue
        if not len(ts):
            problems.append(f"slot {s}: {len(sel)} outputs, no token was sent to it")
            continue
        local, pr = tag_indices(plan, tags[sel], resets=r)
        problems += [f"slot {s}: {p}" for p in pr]
        local = np.clip(local, 0, len(ts) - 1)
        if np.any(np.diff(local) <= 0):
            problems.append(f"slot {s}: outputs out of order or duplicated: its token indices "
                            f"{ts[local].tolist()[:20]}...")
        idx[sel] = ts[local]
    if np.any((slots < 0) | (slots >= S)):
        problems.append(f"an output names slot {int(slots.max())}: the chip has {S}")
    return idx, problems


def place_outputs(plan: RunPlan, tags, slots=None, S: int = 1) -> tuple[np.ndarray, list[str]]:
    """The input index of each output by the chip's tags (tag_indices), with S sequence slots by
    its slot and tag (slot_tag_indices), and the problems found placing them."""
    return slot_tag_indices(plan, tags, slots, S) if S > 1 else tag_indices(plan, tags)


def compare(plan: RunPlan, want: np.ndarray, idx: np.ndarray, got: np.ndarray, tags=None,
            slots=None, S: int = 1) -> list[str]:
    """Every required token's output exactly once, in order, equal to the model's.  With the
    chip's ``tags`` the outputs are placed by them (place_outputs), and the bench's own
    numbering ``idx`` (the k-th output after a reset) is only reported beside them.  With S
    sequence slots (``slots``: each output's), in order within each slot (slot_tag_indices)."""
    problems = []
    if tags is not None:
        idx, problems = place_outputs(plan, tags, slots, S)
        idx = np.clip(idx, 0, plan.tokens - 1)
    if S == 1 and len(idx) and np.any(np.diff(idx) <= 0):
        problems.append(f"outputs out of order or duplicated: input indices {idx.tolist()[:20]}...")
    seen = set(int(i) for i in idx)
    lost = [t for t in np.flatnonzero(plan.required()) if t not in seen]
    if lost:
        problems.append(f"{len(lost)} tokens without an output, first {lost[:5]}")
    for k, t in enumerate(idx):
        if not np.array_equal(got[k], want[t]):
            bad = np.flatnonzero(got[k] != want[t])
            problems.append(f"token {int(t)}: element {int(bad[0])} RTL {int(got[k][bad[0]])} "
                            f"model {int(want[t][bad[0]])} ({len(bad)} elements differ)")
    return problems


def compare_logits(want: np.ndarray, got: np.ndarray, order=None) -> list[str]:
    """The model chip's logits stream, (index, value) per logit in order, against the
    model's (T, V) logits: every token's V logits, indices 0..V-1, values equal.  ``order``:
    the token of each output in the order they came out (the logits of a token come just
    before its output; with several sequence slots that order is not the inputs')."""
    T, V = want.shape
    order = np.arange(T) if order is None else np.asarray(order)
    if len(got) != T * V:
        return [f"logits stream: {len(got)} logits, the model has {T} tokens x {V}"]
    for k, (i, v) in enumerate(got.tolist()):
        n, j = divmod(k, V)
        t = int(order[n])
        if i != j or v != want[t, j]:
            return [f"logits stream: token {t} logit {j}: chip (index {i}, value {v}), model {int(want[t, j])}"]
    return []


class LayerDriver:
    def __init__(self, cfg: Config, qlayer, label: str = "custom", build_root: Path | None = None,
                 model_seed: int = 0):
        """``model_seed``: the channel profile the model was calibrated on (the seed of a random
        layer; 0 for others), which the driver's input tokens are drawn with."""
        from hw.image.memory_map import sequence_slots
        self.cfg, self.q, self.label, self.model_seed = cfg, qlayer, label, model_seed
        self.slots = sequence_slots(cfg)       # independent sequences the chip interleaves
        self.build_root = Path(build_root) if build_root is not None else REPO_ROOT / "build" / cfg.name

    # ---- loading ------------------------------------------------------------------
    @classmethod
    def from_seed(cls, config: str, seed: int = 0) -> "LayerDriver":
        """The seeded random layer, quantised on the fly on its own channel profile."""
        from model.quantize import quantize_random_layer
        cfg = load_config(config)
        return cls(cfg, quantize_random_layer(cfg, seed), label=f"seed{seed}", model_seed=seed)

    @classmethod
    def from_image(cls, config: str, path) -> "LayerDriver":
        """A memory image from `moekda image` (checked against the config: ImageError)."""
        from model.image import read_image_file
        cfg = load_config(config)
        q = read_image_file(cfg, path)
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:8]
        return cls(cfg, q, label=f"image-{digest}")

    @classmethod
    def from_vectors(cls, directory) -> "LayerDriver":
        from model.vectors import load_vectors
        v = load_vectors(Path(directory))
        return cls(v["cfg"], v["qparams"], label=f"vectors-{v['config_hash'][:8]}")

    # ---- the integer model ---------------------------------------------------------
    def inputs(self, tokens: int, seed: int = 1) -> np.ndarray:
        """Residual-stream tokens with corner tokens (zero, full scale +/-) at 1, 2, 3."""
        from model.vectors import vector_inputs
        xs, _ = vector_inputs(self.cfg, self.q, tokens, seed, model_seed=self.model_seed)
        return xs

    def model(self, xs, resets) -> np.ndarray:
        from model.int_layer import int_run_layer
        return int_run_layer(self.q, self.cfg, xs, resets)

    def expected(self, xs, plan: RunPlan, logits: bool = False) -> np.ndarray:
        """What the chip must give for ``xs`` under ``plan``: the integer model run on each
        sequence slot's tokens with that slot's resets (plan.slot_sequences; one slot: the
        plan's), placed back at the tokens' indices.  ``logits``: the model chip's logits."""
        fn = self.logits if logits else self.model
        xs = np.asarray(xs)
        if self.slots == 1:
            return fn(xs, plan.model_resets())
        out = None
        for ts, r in plan.slot_sequences(self.slots):
            if not len(ts):
                continue
            y = fn(xs[ts], r)
            if out is None:
                out = np.zeros((len(xs), *y.shape[1:]), y.dtype)
            out[ts] = y
        return out

    def image(self) -> bytes:
        """The memory image the chip LOADs (hw/image/format.py)."""
        from model.image import qlayer_image
        return qlayer_image(self.cfg, self.q)

    # ---- the RTL --------------------------------------------------------------------
    def verilog(self) -> str:
        """The chip of the config (the layer chip, or the model chip: hw/tops.py
        layer_for_config) as module ``layer``."""
        from amaranth.back import verilog
        from hw.tops import flat_ports, layer_for_config
        chip = layer_for_config(self.cfg)
        return verilog.convert(chip, name="layer", ports=list(flat_ports(chip)), emit_src=False)

    def build(self, simulator: str, waves: bool = False, netlist: Path | None = None,
              verilog_file: Path | None = None, saif: bool = False) -> Path:
        """Build the simulator once per (sources, simulator, waves); returns the build dir.
        The chip's sources: the gate-level ``netlist`` with the kit's cell models, or a
        Verilog file (module ``layer``), or (default) the Verilog generated from this
        driver's model; around it the sim top with the weight memory (sim/hdl/layer_sim.py).
        ``saif``: a Verilator build that can write the netlist's switching activity
        (ACTIVITY_DUMP)."""

        from sim.cocotb_util import simulator_available
        from sim.hdl.layer_sim import sim_top_verilog
        if not simulator_available(simulator):
            raise RuntimeError(f"simulator {simulator} is not installed")
        top, chip_module = "layer_sim", "layer"
        root = self.build_root / "sim" / "layer"
        if netlist is not None:
            from pdk.kit import find_kit
            models = _cell_models(find_kit(required=("verilog_models",)))
            # the kit's models with their flip-flops and latches as always blocks that power up
            # at random values (pdk/cell_models.py: Verilator reads no UDPs, and X from a
            # register no reset reaches through ABC's logic hung Icarus on the gated netlist);
            # one copy for every gate-level build of either simulator
            from pdk.cell_models import write_plain_cell_models
            root.mkdir(parents=True, exist_ok=True)
            models = [write_plain_cell_models(m, root / f"{m.stem}.plain.v") for m in models]
            # a netlist with SRAM macros: `moekda synth` writes their behavioural models beside it
            # (flow/synth.py macro_models_path: <top>.netlist.v -> <top>.macros.v)
            macro_models = Path(netlist).with_name(Path(netlist).name.replace(".netlist.v", ".macros.v"))
            if macro_models != Path(netlist) and macro_models.is_file():
                models = [*models, macro_models]
            kind = "gl"
            key_text = "".join(p.read_text() for p in (Path(netlist), *models))
        elif verilog_file is not None:
            key_text, kind = Path(verilog_file).read_text(), "file"
            if "module layer(" not in key_text:
                raise ValueError(f"{verilog_file}: no module layer (the chip top)")
        else:
            key_text, kind = self.verilog(), "rtl"
        # the chip and its sim top are the same for every model (the image is written into the
        # memory at run time): one build directory per kind of chip source and simulator
        if saif and (netlist is None or simulator != "verilator"):
            raise ValueError("activity (SAIF) needs a gate-level netlist on Verilator")
        build_dir = root / f"{kind}_{simulator}{'_waves' if waves else ''}{'_saif' if saif else ''}"
        build_dir.mkdir(parents=True, exist_ok=True)
        if netlist is not None:
            # the flow's netlist has one port per bit: a wrapper gives the sim top the RTL's vectors
            wrapper = build_dir / "layer_gl.v"
            chip_module = write_gl_wrapper(Path(netlist), "layer", wrapper)
            sources = [wrapper, Path(netlist), *models]
        elif verilog_file is not None:
            sources = [Path(verilog_file)]
        else:
            sources = [build_dir / "layer.v"]
        top_text = sim_top_verilog(self.cfg, chip_module, name=top)
        if netlist is not None:
            key_text += sources[0].read_text()     # the wrapper (and its activity dump) too
        key = hashlib.sha256((key_text + top_text + simulator + str(waves) + " ".join(VERILATOR_ARGS)
                              + (" ".join(SAIF_ARGS) if saif else "")
                              + VERILATOR_PUBLIC).encode()
                             ).hexdigest()
        with open(root / f".{build_dir.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            (build_dir / ".toplevel").write_text(top)     # what run() simulates
            stamp = build_dir / ".built"
            if stamp.exists() and stamp.read_text() == key:
                return build_dir
            if kind == "rtl":
                sources[0].write_text(key_text)
            (build_dir / "layer_sim.v").write_text(top_text)
            args = ICARUS_ARGS
            if simulator == "verilator":
                (build_dir / "public.vlt").write_text(VERILATOR_PUBLIC)
                args = [*VERILATOR_ARGS, str(build_dir / "public.vlt")]
            if kind == "gl":
                # TETRAMAX: the models without their timing checks' X-buffer UDPs
                args = [*args, "-DTETRAMAX"]
                if simulator == "verilator":
                    args += ["-Wno-lint", "-Wno-MULTIDRIVEN", "-Wno-COMBDLY"]
            if saif:
                args = [*args, *SAIF_ARGS]
            _runner(simulator, saif=saif).build(sources=[build_dir / "layer_sim.v", *sources], hdl_toplevel=top,
                                        build_dir=build_dir, build_args=args, always=True, waves=waves,
                                        timescale=("1ns", "1ps"), log_file=build_dir / "build.log")
            stamp.write_text(key)
        return build_dir

    def run(self, plan: RunPlan, simulator: str = "icarus", xs=None, waves: bool | None = None,
            netlist: Path | None = None, name: str | None = None, verilog_file: Path | None = None,
            logits: bool = False, feedback_from: int = 0, saif: bool = False) -> RunResult:
        """``waves`` None: record waveforms when WAVES=1 is in the environment (as sim/cocotb_util.py).
        ``saif``: on the Verilator build ``activity`` uses (one gate-level build for both)."""
        if waves is None:
            waves = os.environ.get("WAVES", "0") not in ("", "0")
        t0 = time.monotonic()
        xs = self.inputs(plan.tokens, seed=plan.seed + 1) if xs is None else np.asarray(xs, np.int64)
        want = self.expected(xs, plan)
        want_logits = self.expected(xs, plan, logits=True) if logits else None
        build_dir = self.build(simulator, waves, netlist, verilog_file, saif=saif)
        run_dir = build_dir / "runs" / (name or f"T{plan.tokens}_s{plan.seed}_{os.getpid()}")
        result, problems = self._simulate(plan, simulator, build_dir, run_dir, xs, want, want_logits,
                                          waves, feedback_from)
        if not result.exists():
            return RunResult(want, np.zeros(0, int), np.zeros((0, want.shape[1]), int), {}, np.zeros(0, int),
                             time.monotonic() - t0, problems)
        return self._result(plan, result, problems, want, want_logits, build_dir, run_dir, waves, t0)

    def activity(self, plan: RunPlan, netlist: Path, saif: Path, stop_after: int, name: str) -> "ActivityStop":
        """The netlist's switching activity from time 0 to the ``stop_after``-th token the chip
        gives out, into the SAIF file ``saif`` (Verilator, ACTIVITY_DUMP).  The simulation
        ends at that token, so the bench does not finish and checks nothing: run the same
        plan with ``run`` for that.  Inputs and stalls are ``run``'s for the plan, so two
        activity runs of one plan are prefixes of one simulation (flow/power.py takes their
        difference)."""
        xs = self.inputs(plan.tokens, seed=plan.seed + 1)
        want = self.expected(xs, plan)
        build_dir = self.build("verilator", False, netlist, saif=True)
        run_dir = build_dir / "runs" / name
        saif = Path(saif).resolve()
        saif.parent.mkdir(parents=True, exist_ok=True)
        saif.unlink(missing_ok=True)
        self._simulate(plan, "verilator", build_dir, run_dir, xs, want, None, False, 0,
                       plusargs=(f"+activity_saif={saif}", f"+activity_stop={stop_after}"))
        return read_activity_stop(run_dir / "sim.log", saif)

    def _simulate(self, plan: RunPlan, simulator: str, build_dir: Path, run_dir: Path, xs, want, want_logits,
                  waves: bool, feedback_from: int, plusargs: tuple[str, ...] = ()) -> tuple[Path, list[str]]:
        """One cocotb run of the case: (its result file, the problems of a bench that did not
        finish)."""
        logits = want_logits is not None
        run_dir.mkdir(parents=True, exist_ok=True)
        case, result = run_dir / "case.npz", run_dir / "result.npz"
        result.unlink(missing_ok=True)
        first = np.zeros(plan.tokens, bool)
        first[[t for t in plan.first if t < plan.tokens]] = True
        clears = np.zeros(plan.tokens, bool)
        clears[[t for t in plan.clears if t < plan.tokens]] = True
        import json

        from model.image import damaged_image
        image = self.image()
        bad = [damaged_image(image, kind) for kind in plan.bad_images]
        np.savez(case, config=json.dumps({"name": self.cfg.name, **self.cfg.to_dict()}),
                 image=np.frombuffer(image, np.uint8), xs=xs,
                 first=first, clears=clears, want=want, reset_at=-1 if plan.reset_at is None else plan.reset_at,
                 abandon=plan.abandon, stall=plan.stall, seed=plan.seed,
                 token_cycles=np.isin(np.arange(plan.tokens), plan.token_cycles),
                 bad_images=np.array([np.frombuffer(b, np.uint8) for b, _ in bad], np.uint8).reshape(len(bad), len(image)),
                 bad_errors=np.array([e for _, e in bad], np.int64),
                 **({"want_logits": want_logits} if logits else {}),
                 **({"slots": plan.slot_of(self.slots)} if self.slots > 1 else {}),
                 **({"feedback_from": feedback_from} if feedback_from else {}))
        try:
            _runner(simulator).test(
                plusargs=list(plusargs),
                test_module="sim.cocotb.tb_layer", hdl_toplevel=(build_dir / ".toplevel").read_text(),
                hdl_toplevel_lang="verilog",
                build_dir=build_dir, test_dir=run_dir, waves=waves, timescale=("1ns", "1ps"),
                results_xml=str(run_dir / "results.xml"), log_file=run_dir / "sim.log",
                extra_env={"LAYER_CASE": str(case), "LAYER_RESULT": str(result),
                           "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])})
        except SystemExit:
            pass          # the runner exits on a failed cocotb test; the result file tells
        if not result.exists():
            return result, [f"the bench did not finish; see {run_dir / 'sim.log'}: {_first_error(run_dir / 'sim.log')}"]
        return result, []

    def _result(self, plan: RunPlan, result: Path, problems: list[str], want, want_logits, build_dir: Path,
                run_dir: Path, waves: bool, t0: float) -> RunResult:
        """The RunResult of a bench that finished: its outputs placed by their tags, compared."""
        logits = want_logits is not None
        z = np.load(result, allow_pickle=False)
        counters = {str(k): int(v) for k, v in zip(z["counter_names"], z["counter_values"])}
        problems += [str(p) for p in z["bench_problems"]]
        # the outputs are placed by the chip's tags (sequence positions), not by the bench's count
        tags = z["tags"] if "tags" in z.files else None
        out_slots = z["slots"] if "slots" in z.files else None
        if tags is None:
            idx = z["idx"]
            problems += compare(plan, want, idx, z["got"], S=self.slots)
        else:
            # placed once: the comparison and the result both use it
            idx, placing = place_outputs(plan, tags, out_slots, self.slots)
            problems += placing + compare(plan, want, np.clip(idx, 0, plan.tokens - 1), z["got"], S=self.slots)
        if logits:
            problems += compare_logits(want_logits, z["logits"], order=np.clip(idx, 0, plan.tokens - 1))
        wave_file = None
        if waves:       # Verilator dumps into the run directory, Icarus into the build directory
            found = [p for d in (run_dir, build_dir) for p in d.glob("*") if p.suffix in (".fst", ".vcd")]
            wave_file = max(found, key=lambda p: p.stat().st_mtime) if found else None
        sim_cycles, sim_s = _sim_time(run_dir / "results.xml")
        return RunResult(want, idx, z["got"], counters, z["token_cycles"], time.monotonic() - t0, problems,
                         wave_file, z["out_cycles"] if "out_cycles" in z.files else None, sim_cycles, sim_s,
                         z["token_cycles_idx"] if "token_cycles_idx" in z.files else None,
                         z["load_cycles"] if "load_cycles" in z.files else None, tags)


class ModelDriver(LayerDriver):
    """The model chip (hw/chip/model.py): token ids in, next token id and its logit out, the
    same bench, sim top and plans as the layer chip (sim/cocotb/tb_layer.py ChipIO).  The
    integer model is model/int_model.py; ``want`` is (T, 2): the next token id (argmax,
    lowest index on a tie) and its logit.  ``logits=True`` in ``run`` also reads every
    logit off the chip's logits stream (CTRL.LOGITS) and compares them all."""

    @classmethod
    def from_seed(cls, config: str, seed: int = 0) -> "ModelDriver":
        """The seeded random model, quantised on the fly on its own tokens."""
        from model.quantize import quantize_random_model
        cfg = load_config(config)
        return cls(cfg, quantize_random_model(cfg, seed), label=f"seed{seed}", model_seed=seed)

    @classmethod
    def from_image(cls, config: str, path) -> "ModelDriver":
        from model.image import qmodel_from_image
        cfg = load_config(config)
        data = Path(path).read_bytes()
        q = qmodel_from_image(cfg, data, what=str(path))
        return cls(cfg, q, label=f"image-{hashlib.sha256(data).hexdigest()[:8]}")

    def inputs(self, tokens: int, seed: int = 1) -> np.ndarray:
        """Random token ids, with the corner ids 0 and vocab-1 at positions 1 and 2."""
        rng = np.random.default_rng(seed)
        ids = rng.integers(0, self.cfg.model.vocab, tokens)
        for t, v in ((1, 0), (2, self.cfg.model.vocab - 1)):
            if t < tokens:
                ids[t] = v
        return ids.astype(np.int64)

    def logits(self, ids, resets) -> np.ndarray:
        from model.int_model import int_run_model
        return int_run_model(self.q, self.cfg, ids, resets)

    def model(self, ids, resets) -> np.ndarray:
        from model.int_model import int_next_tokens
        lg = self.logits(ids, resets)
        nxt = int_next_tokens(lg)
        return np.stack([nxt, lg[np.arange(len(nxt)), nxt]], axis=1)

    def generate(self, prompt, n_new: int, simulator: str = "verilator", stall: bool = False,
                 seed: int = 1) -> tuple[RunResult, list[int], list[int]]:
        """Greedy decoding ON the chip: the prompt as a new sequence, then each id the chip gives
        fed back as its next input (the bench sends it once the output is out), ``n_new`` ids.
        Returns (result, the chip's ids, the integer model's ids: int_generate); the run is also
        checked token by token against the model fed the same ids."""
        res, got, want = self.generate_many([prompt], n_new, simulator, stall, seed)
        return res, got[0], want[0]

    def generate_many(self, prompts, n_new: int, simulator: str = "verilator", stall: bool = False,
                      seed: int = 1) -> tuple[RunResult, list[list[int]], list[list[int]]]:
        """``generate`` of up to hw.sequences prompts of one length at once, prompt p in sequence
        slot p, their tokens interleaved (position k of every prompt, then k+1): the chip runs
        them side by side.  Returns (result, the chip's ids per prompt, the model's per prompt)."""
        from model.int_model import int_generate
        prompts = [[int(t) for t in p] for p in prompts]
        if not prompts or not prompts[0] or n_new < 1:
            raise ValueError("generate: a non-empty prompt and n_new >= 1")
        if len(prompts) > self.slots or len({len(p) for p in prompts}) != 1:
            raise ValueError(f"generate: 1 to {self.slots} prompts (hw.sequences) of one length")
        n, P = len(prompts), len(prompts[0])
        want_ids = [int_generate(self.q, self.cfg, p, n_new) for p in prompts]
        # the inputs the chip will be fed if it agrees with the model; the bench replaces every
        # one after the prompts by the chip's own output for the slot's token before, so a
        # disagreement shows as a mismatch
        seqs = [p + w[:-1] for p, w in zip(prompts, want_ids)]
        xs, _, slots, first = interleave(seqs, self.slots)
        plan = RunPlan(tokens=len(xs), first=first, stall=stall, seed=seed, slots=slots)
        res = self.run(plan, simulator=simulator, xs=xs, name=f"generate_{os.getpid()}",
                       feedback_from=n * P if n_new > 1 else 0)
        by_t = {int(t): int(g[0]) for t, g in zip(res.idx, res.got)}
        got = [[by_t[t] for t in range(n * (P - 1) + q, len(xs), n) if t in by_t] for q in range(n)]
        return res, got, want_ids

    def run_sequences(self, seqs, simulator: str = "verilator", stall: bool = False, seed: int = 1,
                      logits: bool = False, name: str | None = None) -> tuple[RunResult, np.ndarray]:
        """Teacher-forced sequences of one length on the chip, each a sequence of its own: S at
        a time (hw.sequences), sequence j of a group in slot j with their tokens interleaved
        (position k of each, then k+1), so the chip runs them side by side.  Returns the run
        (checked token by token against the integer model; ``logits``: every logit too) and
        the chip's next-token id at every position (n, T), -1 where it gave none."""
        seqs = np.asarray(seqs, np.int64)
        if seqs.ndim != 2 or not seqs.size:
            raise ValueError("run_sequences: an (n, T) array of token ids")
        n, T = seqs.shape
        xs, where, slots, first = interleave(seqs, self.slots)
        plan = RunPlan(tokens=len(xs), first=first, stall=stall, seed=seed, slots=slots)
        res = self.run(plan, simulator=simulator, xs=xs, logits=logits, name=name or f"sequences_{os.getpid()}")
        pred = np.full((n, T), -1, np.int64)
        for t, g in zip(res.idx, res.got):
            if 0 <= t < len(where):
                pred[where[t]] = int(g[0])
        return res, pred

    def image(self) -> bytes:
        from model.image import qmodel_image
        return qmodel_image(self.cfg, self.q)


def interleave(seqs, S: int) -> tuple[np.ndarray, list, tuple, tuple]:
    """Sequences of one length side by side on a chip of S sequence slots: S at a time,
    sequence j of a group in slot j, their tokens interleaved (position k of each, then
    k+1).  Returns the token stream, the (sequence, position) of each stream token, the
    slot of each (empty for S = 1: RunPlan's default) and the stream index of each
    sequence's first token (RunPlan.first)."""
    n, T = len(seqs), len(seqs[0])
    xs, where, slots, first = [], [], [], []
    for g in range(0, n, S):
        group = range(g, min(n, g + S))
        for k in range(T):
            for j, e in enumerate(group):
                if k == 0:
                    first.append(len(xs))
                xs.append(seqs[e][k])
                where.append((e, k))
                slots.append(j)
    return np.array(xs, np.int64), where, tuple(slots) if S > 1 else (), tuple(first)


def chip_driver(cfg_name: str, seed: int = 0) -> LayerDriver:
    """The driver of the config's chip: the layer chip, or the model chip for a vocabulary."""
    cls = LayerDriver if load_config(cfg_name).model.is_layer_chip else ModelDriver
    return cls.from_seed(cfg_name, seed)


def _runner(simulator: str, saif: bool = False):
    """cocotb's runner; for Verilator one that leaves --public-flat-rw out (see VERILATOR_PUBLIC);
    ``saif``: one whose make links Verilator's trace library (cocotb sets VM_TRACE to its
    waves flag, which would leave out the SAIF writer the design's $dumpvars calls)."""
    from cocotb_tools.runner import Verilator, get_runner
    if simulator != "verilator":
        return get_runner(simulator)

    class PortsPublicVerilator(Verilator):
        def _build_command(self):
            cmds = super()._build_command()
            cmds[0] = [a for a in cmds[0] if a != "--public-flat-rw"]
            if saif:
                cmds[1] = [("VM_TRACE=1" if a.startswith("VM_TRACE=") else a) for a in cmds[1]]
            return cmds

    return PortsPublicVerilator()


def write_gl_wrapper(netlist: Path, module: str, out: Path) -> str:
    """A module ``<module>_gl`` with the RTL's vector ports around the netlist's ``module``
    whose ports are single bits named ``\\name[i]`` (Yosys splitnets); returns its name."""
    import re
    text = netlist.read_text()
    # Yosys writes `module layer(`, OpenROAD's write_verilog `module layer (`
    found = re.search(rf"^module\s+{re.escape(module)}\s*\(", text, re.M)
    if not found:
        raise ValueError(f"{netlist}: no module {module}")
    start = found.start()
    body = text[start:text.find("endmodule", start)]
    ports: dict[str, tuple[str, int | None]] = {}       # base -> (direction, max bit or None)
    bits: dict[str, list[str]] = {}
    for direction, name in re.findall(r"^\s*(input|output)\s+(\\\S+|\w+)\s*;", body, re.M):
        mm = re.fullmatch(r"\\(\w+)\[(\d+)\]", name)
        if mm:
            base, i = mm.group(1), int(mm.group(2))
            hi = ports.get(base, (direction, -1))[1]
            ports[base] = (direction, max(hi, i))
            bits.setdefault(base, []).append(name)
        else:
            ports[name] = (direction, None)
    top = f"{module}_gl"
    decl = [f"  {d} {'' if hi is None else f'[{hi}:0] '}{n};" for n, (d, hi) in ports.items()]
    conns = []
    for n, (_d, hi) in ports.items():
        if hi is None:
            conns.append(f"    .{n}({n})")
        else:
            conns += [f"    .\\{n}[{i}] ({n}[{i}])" for i in range(hi + 1)]
    out.write_text(f"// generated by run/driver.py: vector ports around the gate-level {module}\n"
                   f"module {top}({', '.join(ports)});\n" + "\n".join(decl) + "\n"
                   f"  {module} u_{module} (\n" + ",\n".join(conns) + "\n  );\n"
                   + (ACTIVITY_DUMP.replace("u_layer", f"u_{module}") if {"i__valid", "o__valid"} <= set(ports)
                      else "") + "endmodule\n")
    return top


# Switching activity for power analysis (flow/power.py, `moekda power`): with
# +activity_saif=FILE Verilator writes every net's toggle count and time at 1 from time 0
# (SAIF: compact, whatever the run's length, where a VCD of the model chip would take
# gigabytes); with +activity_stop=K the simulation ends at the K-th token the chip gives
# out, and the time is printed.  Verilator's SAIF ignores $dumpoff and counts its times
# from 0 whenever it is opened, so a window of tokens is the difference of two runs that
# stop at its two ends (LayerDriver.activity, flow/power.py).
ACTIVITY_DUMP = """\
  reg [8*1024-1:0] activity_file;
  integer activity_stop, activity_out;
  initial begin
    activity_out = 0;
    // %t in ps whatever time unit this module inherits from the files compiled before it
    $timeformat(-12, 0, " ps", 0);
    if (!$value$plusargs("activity_stop=%d", activity_stop)) activity_stop = 0;
    if ($value$plusargs("activity_saif=%s", activity_file)) begin
      $dumpfile(activity_file);
      $dumpvars(0, u_layer);
    end
  end
  always @(posedge clk) if (activity_stop > 0 && o__valid && o__ready) begin
    activity_out = activity_out + 1;
    if (activity_out == activity_stop) begin
      $display("activity: stop at %0t after %0d tokens", $realtime, activity_out);
      $finish;
    end
  end
"""


@dataclass(frozen=True)
class ActivityStop:
    """Where an activity run ended: at ``time_ps`` of the bench's clock, the ``tokens``-th
    token out; ``saif`` holds the activity from time 0 to then."""
    time_ps: int
    tokens: int
    saif: Path


_STOP = re.compile(r"activity: stop at (\d+) ps after (\d+) tokens")


def read_activity_stop(sim_log: Path, saif: Path) -> ActivityStop:
    text = sim_log.read_text(errors="replace") if sim_log.is_file() else ""
    found = _STOP.search(text)
    if not found:
        raise RuntimeError(f"{sim_log}: the activity run did not reach its stop token: {_first_error(sim_log)}")
    if not saif.is_file():
        raise RuntimeError(f"the activity run wrote no {saif}")
    return ActivityStop(int(found.group(1)), int(found.group(2)), saif)



def _cell_models(kit) -> list[Path]:
    models = kit.verilog_models if hasattr(kit, "verilog_models") else kit["verilog_models"]
    if isinstance(models, (str, Path)):
        models = [models]
    return [Path(p) for p in models]


def _sim_time(results_xml: Path) -> tuple[int, float]:
    """(clock cycles simulated, wall seconds) of the bench from cocotb's results file."""
    import xml.etree.ElementTree as ET

    from sim.cocotb.clocking import CLOCK_NS
    try:
        case = next(ET.parse(results_xml).iter("testcase"))
    except (OSError, ET.ParseError, StopIteration):
        return 0, 0.0
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    return int(float(props.get("sim_time_duration", 0)) // CLOCK_NS), float(case.get("time", 0))


def _first_error(log: Path) -> str:
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        if "Error" in line or "FAIL" in line:
            return line.strip()
    return "(no error line in the log)"
