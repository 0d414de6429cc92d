"""pdctl package ``env``: the cluster simulator, workloads, scenarios and the gymnasium env (see docs/design.md).

Importing ``env`` registers ``pdctl/PDCluster-v1`` with gymnasium through a lazy entry point: the simulator and
the env module load only when ``gymnasium.make`` builds the env.
"""

from gymnasium.envs.registration import register, registry

__all__ = ["ENV_ID"]

ENV_ID = "pdctl/PDCluster-v1"

if ENV_ID not in registry:
    register(id=ENV_ID, entry_point="env.gym_env:PDClusterEnv", disable_env_checker=False)
