# moekda: the commands a user runs.  `make help` lists them.
#
# Every target depends on the set-up stamp, so the first `make synth` or
# `make test` on a fresh machine installs what is missing (tools/setup.sh).
# All real work is done by the `moekda` command in .venv; the targets only
# name it, so `moekda <command> --help` documents every option.

CONFIG ?= tiny
TOP    ?=
PYTHON ?= python3
VENV   := .venv
MOEKDA := $(VENV)/bin/moekda
PYTEST := $(VENV)/bin/python -m pytest
STAMP  := $(VENV)/.setup-stamp
TOPARG := $(if $(TOP),--top $(TOP))

.DEFAULT_GOAL := help
.PHONY: help setup setup-force versions test sim rtl synth report pnr drc pnr-check \
        accuracy vectors bench sweep demo clean distclean

help:
	@echo "moekda - KDA + MoE layer accelerator generator and Nangate45 flow"
	@echo ""
	@echo "  make setup            install tools, Python deps and the Nangate45 kit (done by every target)"
	@echo "  make test             the default test suite (models, RTL simulation, flow checks)"
	@echo "  make sim    [CONFIG=] [GL=1] [WAVES=1]  cocotb simulations of the RTL against the integer model"
	@echo "  make rtl    [CONFIG=] [TOP=]   Verilog into build/<config>/rtl/"
	@echo "  make synth  [CONFIG=] [TOP=]   Yosys + OpenSTA: area, timing, power in build/<config>/reports/"
	@echo "  make pnr    [CONFIG=] [TOP=]   OpenROAD place and route (needs openroad on PATH or OPENROAD=)"
	@echo "  make drc    [CONFIG=] [TOP=]   KLayout DRC of the routed GDS (needs Debian's klayout)"
	@echo "  make accuracy [CONFIG=]        error of the integer model against the float model"
	@echo "  make vectors  [CONFIG=]        export inputs, integer parameters and expected outputs (256 tokens)"
	@echo "  make bench                     cycles/token vs roofline, Fmax, area, energy: tiny, small, model-tiny, model-small(-sram)"
	@echo "  make sweep                     design-space sweep with Ray: Pareto table and plot"
	@echo "  make demo [GL=1]               the committed trained models (MQAR, characters): float, integer, RTL (docs/training.md)"
	@echo "  make train [TRAIN_ARGS=]       train a model on MQAR with JAX (installed on first use; docs/training.md)"
	@echo "  make train-setup               install the training extra (requirements-train.txt) into .venv"
	@echo "  make clean                     remove build/"
	@echo ""
	@echo "  CONFIG is a name under configs/ (tiny, small) or a path to a .toml file; default tiny."

# ---- set-up ---------------------------------------------------------------
$(STAMP): pyproject.toml pdk/nangate45.sha256 pdk/nangate45.derived.sha256 pdk/lef_patch.py tools/setup.sh
	@PYTHON=$(PYTHON) VENV=$(VENV) bash tools/setup.sh
	@touch $@

setup: $(STAMP)
	@:

setup-force:
	@rm -f $(STAMP) && $(MAKE) --no-print-directory setup

versions: $(STAMP)
	@$(VENV)/bin/python tools/versions.py

# ---- tests ----------------------------------------------------------------
# The default suite: everything not marked slow.  CI runs exactly this.  Two workers
# (pytest-xdist), a test file each at a time: the benches share their simulator builds
# through locks (sim/cocotb_util.py); serially one of CI's two cores idled (half the suite
# took 13 min).
test: $(STAMP)
	$(PYTEST) -m "not slow" -n 2 --dist loadfile --durations=40

# make sim: the simulations only.  tiny: the fast set; another CONFIG: every
# simulation including the long runs; GL=1: the gate-level run of the netlist.
# WAVES=1 writes waveforms into each test's build directory.
SIM_MARK := $(if $(GL),gl,$(if $(filter tiny,$(CONFIG)),not slow,not gl))
sim: $(STAMP)
	MOEKDA_CONFIG=$(CONFIG) WAVES=$(WAVES) $(PYTEST) sim/tests -m "$(SIM_MARK)"

# ---- design flow ------------------------------------------------------------
rtl: $(STAMP)
	$(MOEKDA) rtl -c $(CONFIG) $(TOPARG)

synth: $(STAMP)
	$(MOEKDA) synth -c $(CONFIG) $(TOPARG)

report: $(STAMP)
	$(MOEKDA) report -c $(CONFIG) $(TOPARG)

pnr: $(STAMP)
	$(MOEKDA) pnr -c $(CONFIG) $(TOPARG)

# KLayout DRC of the routed GDS (after make pnr); needs Debian's klayout application
drc: $(STAMP)
	$(MOEKDA) drc -c $(CONFIG) $(TOPARG)

pnr-check: $(STAMP)
	$(MOEKDA) pnr -c $(CONFIG) $(TOPARG) --check

accuracy: $(STAMP)
	$(MOEKDA) accuracy -c $(CONFIG)

vectors: $(STAMP)
	$(MOEKDA) vectors -c $(CONFIG) -n 256 -o build/$(CONFIG)/vectors

# make bench: measured performance of the layer chips (tiny, small) and the model chips
# (model-tiny, model-small with its state in flip-flops and in SRAM, model-tiny-kda-mla) into
# bench/results/.  Contexts are sequence positions: with two sequence slots, 8192 tokens reach
# context 4096 in both.  model-small has no Icarus speed run (--speed-tokens 0): Icarus takes
# hours for its LOAD and one token.  Each record is checked against its committed metric
# rules (bench/rules/<config>.json, flow/rules.py): a regression stops make bench (exit 1).
# a committed trained model on its task: float, integer and RTL accuracy, cycles per token
# (no training framework); GL=1 also runs a few tokens on the synthesised netlist (slow)
demo: $(STAMP)
	$(MOEKDA) demo $(if $(GL),--netlist) $(DEMO_ARGS)

bench: $(STAMP)
	$(MOEKDA) bench -c tiny --tokens 4096 --synth
	$(MOEKDA) bench -c small --tokens 1024 --synth
	$(MOEKDA) bench -c model-tiny --tokens 8192 --synth
	$(MOEKDA) bench -c model-small --tokens 1024 --speed-tokens 0 --synth
	$(MOEKDA) bench -c model-small-sram --tokens 1024 --speed-tokens 0 --synth
	$(MOEKDA) bench -c model-tiny-kda-mla --tokens 8192 --synth
	$(MOEKDA) context -c model-tiny-hybrid --tokens 4096
	$(MOEKDA) context -c model-small-hybrid --tokens 4096

# make sweep: Ray is an optional extra, installed on first use.
SWEEP_STAMP := $(VENV)/.sweep-stamp
$(SWEEP_STAMP): $(STAMP)
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check -e '.[pnr,sweep]'
	@touch $@

sweep: $(SWEEP_STAMP)
	$(MOEKDA) sweep --grid bench/sweep.toml

# make train: the training extra (JAX on the CPU, requirements-train.txt) is installed on
# first use, never by make setup.  One XLA thread and nice: the machine's cores belong to
# the simulations first.
TRAIN_STAMP := $(VENV)/.train-stamp
TRAIN_ARGS  ?=
.PHONY: train train-setup
$(TRAIN_STAMP): $(STAMP) requirements-train.txt
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-train.txt
	@touch $@

train-setup: $(TRAIN_STAMP)
	@:

train: $(TRAIN_STAMP)
	XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \
	  nice -n 10 $(VENV)/bin/python -m train $(TRAIN_ARGS)

clean:
	rm -rf build

distclean: clean
	rm -rf $(VENV) pdk/nangate45
