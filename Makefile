# verl-launch: `make demo` runs the main job on the local Slurm sandbox; `make test` runs the
# tests (the sandbox ones included). Both set up a fresh Debian machine themselves (as root).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SANDBOX := tests/cluster
# Debian's Slurm for the sandbox (slurmdbd and MariaDB for its accounting mode), shellcheck
# for the rendered scripts.
SYSTEM_PKGS := slurmctld slurmd slurm-client slurmdbd mariadb-server munge iproute2 util-linux shellcheck

.PHONY: install node-env system-deps test test-quick test-verl demo demo-verl sandbox-up sandbox-down lint bench bench-check bench-bringup bench-inputs-check bench-bad-node bench-sweep bench-traces bench-first-step bench-dead-engine bench-wandb-end bench-trace-end bench-report clean

install: $(VENV)/.installed

# tests/tools/pip_install.py: pip's own configuration handed to uv (pip where uv cannot be had)
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) tests/tools/pip_install.py -e '.[test]'
	touch $@

# TEST-ONLY: what the sandbox's nodes run so that verl trains on CPUs with vLLM's CPU build
# (tests/node_env/README.md). Never a dependency of the launcher.
NODE_VENV ?= .venv-node
NODE_PY := $(NODE_VENV)/bin/python
node-env: $(NODE_VENV)/.installed

$(NODE_VENV)/.installed: tests/node_env/requirements.txt
	rm -rf $(NODE_VENV)
	$(PYTHON) -m venv $(NODE_VENV)
	$(NODE_PY) -m pip install -q --upgrade pip
	$(NODE_PY) tests/tools/pip_install.py -r tests/node_env/requirements.txt
	@# The index's torchvision/torchcodec are CUDA builds: beside them `import vllm` fails.
	$(NODE_PY) -m pip uninstall -y -q torchvision torchcodec
	@# WANDB_ERROR_REPORTING: weave's import would otherwise try to report to its error service
	cd /tmp && WANDB_ERROR_REPORTING=false VERL_PLATFORM=cpu PYTHONPATH=$(abspath tests/cpu_platform) $(abspath $(NODE_PY)) -c \
	  'import vllm, verl, ray, weave, wandb; from vllm.platforms import current_platform as p; assert p.is_cpu()'
	touch $@

system-deps:
	@missing=$$(for p in $(SYSTEM_PKGS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages: $$missing"; \
	  DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

# Everything, in five runs: the quick tier (verl kept out, as in test-quick) on 2 workers; the verl
# tier and the training tests that use no Slurm (the V1 local run, the node environment's and the
# tool model's probes, verl's command lines) on 2 workers, test by test (each probe a session
# fixture: a worker runs it once); then the sandbox tests marked sandbox_shared two at a time (their
# jobs name no node and train nothing: a demo job mostly waits), the other sandbox tests in one
# process (beside a second worker the sandbox's timing-sensitive tests failed on 2 cores), then the tests
# that read accounting, with slurmdbd (once: of them only the `jobcomp` one also runs in the third
# run, against Slurm's job-completion log, the fallback without slurmdbd). Each run goes on after
# another fails, so that one report names every failure. docs/testing.md: the tiers, which
# training job serves which tests.
# The smoke assets (the tool model is taught on the CPU, about 170 s) are built beside the quick
# tier (tests/smoke_cache.py): in the verl tier a worker sat idle while the other built them.
# The two environments install side by side, through uv (tests/tools/pip_install.py): 123 s on a
# fresh 2-core machine, pip 212 s.
test: system-deps
	@$(MAKE) --no-print-directory -j2 install node-env
	rc=0; \
	$(PY) tests/smoke_cache.py >/dev/null & early=$$!; \
	PYTHONPATH=$(abspath tests/no_verl) $(PY) -m pytest -q -p no:cacheprovider -n 2 --durations=5 \
	  -m "not sandbox and not train and not verl" || rc=1; \
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --durations=15 -m "(verl or train) and not sandbox" || rc=1; \
	wait $$early; \
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadscope --durations=5 \
	  -m "sandbox_shared and ((sandbox and not accounting) or jobcomp)" || rc=1; \
	$(PY) -m pytest -q -p no:cacheprovider --durations=15 -m "((sandbox and not accounting) or jobcomp) and not sandbox_shared" || rc=1; \
	SANDBOX_ACCOUNTING=dbd $(PY) -m pytest -q -p no:cacheprovider --durations=5 -m accounting || rc=1; \
	exit $$rc

# The edit-test loop: the launcher's own logic, with neither the Slurm sandbox, nor verl (no root,
# no node environment, no model; tests/no_verl keeps verl out, as on a login node), in minutes.
test-quick: install
	PYTHONPATH=$(abspath tests/no_verl) $(PY) -m pytest -q -p no:cacheprovider -n 2 --durations=10 \
	  -m "not sandbox and not train and not verl"

# What imports verl (check's preflight, verl's config), builds the smoke assets or runs a local job.
test-verl: install
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --durations=10 -m "verl and not sandbox and not train"

sandbox-up: system-deps
	@bash $(SANDBOX)/sandbox-up.sh

sandbox-down:
	@bash $(SANDBOX)/sandbox-down.sh

# The demo never contacts W&B; without your own key it makes up a throwaway one.
demo: system-deps install
	@eval "$$(bash $(SANDBOX)/sandbox-up.sh)" && \
	export WANDB_API_KEY="$${WANDB_API_KEY:-sandbox-$$($(PY) -c 'import secrets; print(secrets.token_hex(24))')}" && \
	out=$$($(VENV)/bin/verl-launch submit recipes/sandbox-demo.yaml runtime.python=$(abspath $(PY)) --wait --json); \
	rc=$$?; job=$$(printf '%s' "$$out" | $(PY) -c 'import json, sys; print(json.load(sys.stdin)["job_id"])' 2>/dev/null) && \
	echo "--- the payload's report (verl-launch logs $$job --driver):" && $(VENV)/bin/verl-launch logs "$$job" --driver; \
	echo "--- the sandbox is still up; to use the CLI against it (README, \"Using the CLI against the sandbox\"):"; \
	echo "    export SLURM_CONF=$$SLURM_CONF; $(VENV)/bin/verl-launch list"; \
	exit $$rc

# verl's own trainer on the sandbox: async-rollout GRPO with vLLM's CPU build on 2 nodes, Weave
# traces to a loopback W&B stand-in, then a short report. Test-only node environment and CPU
# platform: see docs/internals.md, "verl's own trainer on the sandbox".
SMOKE ?= /tmp/verl-launch-smoke
demo-verl: system-deps install node-env
	@test -f $(SMOKE)/reward.py || $(PY) -m launcher.smoke_assets --out $(SMOKE) >/dev/null
	@eval "$$(bash $(SANDBOX)/sandbox-up.sh)" && \
	VERL_SMOKE_DIR=$(SMOKE) $(PY) tests/demo_verl.py --node-python $(abspath $(NODE_PY))

lint: install
	$(VENV)/bin/verl-launch render recipes/sandbox-demo.yaml runtime.python=python3 | shellcheck -
	$(PY) -c 'from launcher.core.recipe import load; from launcher.core.render import render_array; \
	  print(render_array(load("recipes/sandbox-demo.yaml").plan, "demo-sweep", 4, 2), end="")' | shellcheck -
	bash -n $(SANDBOX)/*.sh && shellcheck $(SANDBOX)/*.sh .ci/run

bench: install
	$(PY) bench/render_bench.py

bench-check: install
	$(PY) bench/check_bench.py

# Each simulated node gets its own CPU budget (a cgroup quota), or 4 nodes share 2 cores.
bench-bringup: install
	@eval "$$(SANDBOX_NODE_CPU=$${SANDBOX_NODE_CPU:-0.45} bash $(SANDBOX)/sandbox-up.sh)" && $(PY) bench/bringup_bench.py

bench-inputs-check: install
	@eval "$$(bash $(SANDBOX)/sandbox-up.sh)" && $(PY) bench/inputs_check_bench.py

bench-bad-node: install
	@eval "$$(bash $(SANDBOX)/sandbox-up.sh)" && $(PY) bench/bad_node_bench.py

# From submit to verl's first training step on the sandbox: the launcher's share (target <= 0.10).
bench-first-step: install node-env
	@test -f $(SMOKE)/reward.py || $(PY) -m launcher.smoke_assets --out $(SMOKE) >/dev/null
	@eval "$$(bash $(SANDBOX)/sandbox-up.sh)" && VERL_SMOKE_DIR=$(SMOKE) $(PY) bench/first_step_bench.py --repeat 2

bench-dead-engine: install node-env
	@test -f $(SMOKE)/reward.py || $(PY) -m launcher.smoke_assets --out $(SMOKE) >/dev/null
	@eval "$$(bash $(SANDBOX)/sandbox-up.sh)" && VERL_SMOKE_DIR=$(SMOKE) $(PY) bench/dead_engine_bench.py

# The last step's trace flush at verl's end: what it costs the end, and what arrives without it.
bench-trace-end: install node-env
	@test -f $(SMOKE)/reward.py || $(PY) -m launcher.smoke_assets --out $(SMOKE) >/dev/null
	@eval "$$(bash $(SANDBOX)/sandbox-up.sh)" && VERL_SMOKE_DIR=$(SMOKE) $(PY) bench/trace_end_bench.py --repeat 2

bench-wandb-end: install
	@eval "$$(bash $(SANDBOX)/sandbox-up.sh)" && $(PY) bench/wandb_end_bench.py --repeat 3

bench-sweep: install
	$(PY) bench/sweep_bench.py

bench-traces: install
	$(PY) bench/traces_bench.py --sizes 10000 100000

bench-report: install
	$(PY) bench/report_bench.py --steps 1000 10000

clean:
	rm -rf $(VENV) dist build *.egg-info
