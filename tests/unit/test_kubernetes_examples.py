"""examples/kubernetes/ parsed as Kubernetes would: each object through the official
`kubernetes` client's models (a Job, and the Job template inside a JobSet) or Kubeflow
Trainer's (`kubeflow-trainer-api`, a TrainJob), round-tripped so that a misspelt field (which
the models would drop) fails; the pod failure policies against gpulaunch's exit codes; and
the gpulaunch command line of each through gpulaunch's own parser. There is no cluster here:
what a cluster does with them is not tested."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob
from kubernetes.client import ApiClient

from gpulaunch.cli import build_parser
from gpulaunch.model import CRASH_LOOP_STATUS, PREEMPTED_STATUS

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kubernetes"
CONFIG_STATUS = 78  # a bad unit template or setting; a rank's EX_CONFIG (gpulaunch/errors.py)
# JobSet v1alpha2 (kubernetes-sigs/jobset, api/jobset/v1alpha2/jobset_types.go): no Python
# models are published, so its own fields are checked against these; its Job templates
# through the kubernetes client.
JOBSET_SPEC = {"replicatedJobs", "network", "successPolicy", "failurePolicy", "startupPolicy",
               "suspend", "coordinator", "managedBy", "ttlSecondsAfterFinished"}  # fmt: skip
JOBSET_REPLICATED = {"name", "groupName", "template", "replicas", "dependsOn"}
JOBSET_FAILURE = {"maxRestarts", "restartStrategy", "rules"}
JOBSET_RULE = {"name", "action", "onJobFailureReasons", "onJobFailureMessagePatterns",
               "targetReplicatedJobs"}  # fmt: skip
JOBSET_ACTIONS = {"FailJobSet", "RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts"}

api = ApiClient()


def _documents(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((EXAMPLES / name).read_text()) if doc]


def _strip(value: Any) -> Any:
    """YAML as the client serialises it back: no empty values."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if v not in (None, [], {})}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _round_trip(doc: dict[str, Any], kind: str) -> Any:
    model = api._ApiClient__deserialize(doc, kind)  # type: ignore[attr-defined]
    assert api.sanitize_for_serialization(model) == _strip(doc), f"{kind}: a field was dropped"
    return model


def _action(rules: list[dict[str, Any]], status: int) -> str:
    """What a pod failure policy does with a container's exit `status` (first rule wins;
    no rule: Count), as the Job controller reads it."""
    for rule in rules:
        codes = rule.get("onExitCodes")
        if codes is None:
            continue
        inside = status in codes["values"]
        if inside == (codes["operator"] == "In"):
            return str(rule["action"])
    return "Count"


def _check_policy(job_spec: dict[str, Any]) -> None:
    rules = job_spec["podFailurePolicy"]["rules"]
    assert _action(rules, PREEMPTED_STATUS) == "Ignore"  # requeue: a disruption
    assert _action(rules, CONFIG_STATUS) == "FailJob"  # retrying a bad setting cannot help
    assert _action(rules, CRASH_LOOP_STATUS) == "FailJob"
    for rank_status in (1, 3, 134, 137, 143):  # the rank's own: retried within the limit
        assert _action(rules, rank_status) == "Count"
    disruption = [r for r in rules if "onPodConditions" in r]
    assert disruption and disruption[0]["action"] == "Ignore"


def _check_container(pod_spec: dict[str, Any]) -> None:
    assert pod_spec["restartPolicy"] == "Never"  # a pod failure policy needs it
    (container,) = pod_spec["containers"]
    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert container["terminationMessagePolicy"] == "File"
    _check_command(container["command"], {"JOB_COMPLETION_INDEX": "1"})
    grace = int(_option(container["command"], "--preempt-grace"))
    assert pod_spec["terminationGracePeriodSeconds"] > grace  # the kubelet waits that long


def _option(argv: list[str], name: str) -> str:
    return next(a.split("=", 1)[1] for a in argv if a.startswith(name + "="))


def _check_command(argv: list[str], env: dict[str, str]) -> None:
    """The command runs `gpulaunch start` on several nodes, and gpulaunch parses it."""
    words = [_expand(w, env) for w in argv]
    assert words[:2] == ["gpulaunch", "start"]
    args = build_parser().parse_args(words[1:])
    assert args.nnodes == "2" and args.node_rank == 1 and args.script == "train.py"


def _expand(word: str, env: dict[str, str]) -> str:
    for name, value in env.items():  # Kubernetes' $(VAR) in a command
        word = word.replace(f"$({name})", value)
    return word


def test_the_job_acts_on_gpulaunchs_exit_codes() -> None:
    service, job = _documents("job.yaml")
    _round_trip(service, "V1Service")
    _round_trip(job, "V1Job")
    assert job["spec"]["completionMode"] == "Indexed"  # JOB_COMPLETION_INDEX: the node rank
    _check_policy(job["spec"])
    _check_container(job["spec"]["template"]["spec"])


def test_the_jobset_acts_on_gpulaunchs_exit_codes() -> None:
    (jobset,) = _documents("jobset.yaml")
    assert jobset["apiVersion"] == "jobset.x-k8s.io/v1alpha2" and jobset["kind"] == "JobSet"
    spec = jobset["spec"]
    assert set(spec) <= JOBSET_SPEC
    assert set(spec["failurePolicy"]) <= JOBSET_FAILURE
    for rule in spec["failurePolicy"]["rules"]:
        assert set(rule) <= JOBSET_RULE and rule["action"] in JOBSET_ACTIONS
    (replicated,) = spec["replicatedJobs"]
    assert set(replicated) <= JOBSET_REPLICATED
    _round_trip(replicated["template"], "V1JobTemplateSpec")
    job_spec = replicated["template"]["spec"]
    assert job_spec["backoffLimit"] == 0  # a counted failure is JobSet's restart
    _check_policy(job_spec)
    _check_container(job_spec["template"]["spec"])
    name = f"{jobset['metadata']['name']}-{replicated['name']}-0-0.{jobset['metadata']['name']}"
    command = job_spec["template"]["spec"]["containers"][0]["command"]
    assert _option(command, "--master-addr") == name  # JobSet's name for node 0's pod


def test_the_trainjob_runs_gpulaunch_with_the_runtimes_variables() -> None:
    (doc,) = _documents("trainjob.yaml")
    job = TrainerV1alpha1TrainJob.from_dict(doc)
    assert job is not None and job.to_dict() == _strip(doc)
    trainer = doc["spec"]["trainer"]
    sh, flag, script = trainer["command"]
    assert (sh, flag) == ("sh", "-c") and script.startswith("exec gpulaunch start ")
    env = {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "train-node-0-0.train",
           "PET_MASTER_PORT": "29400", "PET_NPROC_PER_NODE": "8"}  # fmt: skip
    words = shlex.split(script.removeprefix("exec "))
    expanded = [next((v for k, v in env.items() if w == f"${k}"), w) for w in words]
    _check_command(expanded, {})


@pytest.mark.parametrize("name", ["job.yaml", "jobset.yaml", "trainjob.yaml"])
def test_a_misspelt_field_fails(name: str, tmp_path: Path) -> None:
    """The round trip catches what the models drop: the tests above can fail."""
    (doc, *_) = reversed(_documents(name))
    container = doc["spec"]
    container["templat"] = container.pop(next(iter(container)))
    with pytest.raises((AssertionError, ValueError, TypeError)):
        if doc["kind"] == "TrainJob":
            assert TrainerV1alpha1TrainJob.from_dict(doc).to_dict() == _strip(doc)
        elif doc["kind"] == "JobSet":
            assert set(doc["spec"]) <= JOBSET_SPEC
        else:
            _round_trip(doc, "V1Job")
