"""verl's own checks of a full override list, run by `verl-launch check` / `submit` in a
subprocess with the recipe's interpreter (``runtime.python``): the verl that the job will run.

Standalone on purpose (it imports nothing from verl-launch, which that interpreter may not
have). Run as ``python -c <this file's text>`` from an empty directory, so that nothing beside it
shadows a module verl imports. Reads {"overrides": [...]} as JSON on stdin; prints one line "@@preflight <json>":
  {"ok": true, "verl_version": ..., "config": {a few resolved values}}
  {"ok": false, "verl_version": ..., "stage": "import|compose|validate|dataclass", "error": ...}
Exits 0 in both cases (the launcher decides), 3 if verl is not importable.
"""

import json
import os
import sys

RESULT = "@@preflight "
# Resolved values the launcher reports on (trace volume, resources).
REPORT_KEYS = ("actor_rollout_ref.rollout.n", "actor_rollout_ref.rollout.agent.num_workers",
               "actor_rollout_ref.rollout.trace.backend",
               "actor_rollout_ref.rollout.trace.max_samples_per_step_per_worker",
               "data.train_batch_size", "trainer.nnodes", "trainer.n_gpus_per_node",
               "trainer.default_local_dir", "trainer.logger", "trainer.use_v1",
               "reward.num_workers", "reward_model.num_workers",
               "transfer_queue.backend.SimpleStorage.num_data_storage_units",
               "trainer.max_actor_ckpt_to_keep", "trainer.max_critic_ckpt_to_keep")


def emit(**result):
    print(RESULT + json.dumps(result, default=str), flush=True)


def message(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    cause = e.__cause__ or e.__context__
    while cause is not None and str(cause) and str(cause) not in text:  # Hydra wraps the real error
        text += f" (caused by {type(cause).__name__}: {cause})"
        cause = cause.__cause__
    return " ".join(text.split())


def main() -> int:
    overrides = json.load(sys.stdin)["overrides"]
    try:
        import verl
    except Exception as e:  # not installed, or broken: the launcher says so plainly
        emit(ok=False, stage="import", error=message(e), verl_version=None)
        return 3
    version = getattr(verl, "__version__", "unknown")
    stage = "compose"
    try:
        from hydra import compose, initialize_config_dir
        from omegaconf import OmegaConf

        config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            cfg = compose(config_name="ppo_trainer", overrides=overrides)
        # Everything must resolve, as it will in main_ppo (a misspelt ${...} fails here).
        OmegaConf.resolve(cfg)

        stage = "validate"
        from verl.trainer.ppo.utils import need_critic, need_reference_policy
        from verl.utils.config import omega_conf_to_dataclass, validate_config

        validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))

        # A `+key` that verl does not know passes Hydra and fails only when the workers build
        # their dataclasses (validate_config built the actor's and critic's): the rollout's
        # here. (The model's would load the model: not on a login node.)
        stage = "dataclass"
        omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    except BaseException as e:  # noqa: B036 - Hydra and verl raise assertion errors too
        emit(ok=False, stage=stage, error=message(e), verl_version=version)
        return 0
    report = {k: OmegaConf.select(cfg, k, default=None) for k in REPORT_KEYS}
    emit(ok=True, verl_version=version,
         config={k: OmegaConf.to_container(v) if OmegaConf.is_config(v) else v for k, v in report.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
