"""verl's own verdict on verl command lines (TEST-ONLY; run with an interpreter that has verl).

Reads [{"config_name": str|null, "overrides": [...]}, ...] as JSON on stdin and prints, after
whatever verl prints, one line "@@verdicts <JSON list>": {"verdict": "accepted"|"refused",
"why": verl's own words, "machine": bool} per command line.

Each line goes through verl.trainer.main_ppo's own Hydra main() (its auto_set_device and
validate_config), in this one process, stopped at run_ppo, just before Ray starts: "accepted"
is a config verl would have started Ray with. Hydra's global state is cleared between lines.
A refusal that says nothing of the command line (verl fetching a model's config from the hub
with no network, a vLLM whose version verl cannot read) is "accepted" with machine=true, as in
../shared/reference/verl-examples/README.md.
"""

import json
import os
import re
import sys
import tempfile

# Not the command line's fault: this machine has no network and vLLM's CPU build.
MACHINE = re.compile(r"huggingface|HFValidationError|OfflineModeIsEnabled|LocalEntryNotFound|"
                     r"Connection|resolve|Max retries|vllm.*version|InvalidVersion|"
                     r"We couldn't connect|not a valid model identifier|config\.json", re.I)


MARK = "@@verdicts "


class Stop(Exception):
    """main() reached run_ppo: verl would start Ray now."""


def main() -> int:
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra's own errors raised, not printed and exited
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from hydra.core.global_hydra import GlobalHydra

    import verl.trainer.main_ppo as main_ppo

    def stop(config, task_runner_class=None):
        raise Stop

    main_ppo.run_ppo = stop
    lines = json.load(sys.stdin)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for line in lines:
            GlobalHydra.instance().clear()
            name = line.get("config_name")
            sys.argv = ["main_ppo", *([f"--config-name={name}"] if name else []), *line["overrides"],
                        f"hydra.run.dir={tmp}", "hydra.output_subdir=null",
                        "hydra/job_logging=none", "hydra/hydra_logging=none"]
            try:
                main_ppo.main()
                out.append({"verdict": "refused", "why": "main() returned without reaching run_ppo", "machine": False})
            except Stop:
                out.append({"verdict": "accepted", "why": "", "machine": False})
            except BaseException as e:  # noqa: BLE001 - verl and Hydra raise assertions and SystemExit too
                why = " ".join(f"{type(e).__name__}: {e}".split())
                machine = bool(MACHINE.search(why))
                out.append({"verdict": "accepted" if machine else "refused", "why": why, "machine": machine})
    print(MARK + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
