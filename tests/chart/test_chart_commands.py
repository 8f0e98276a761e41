"""Every rendered container's command line, as the kubelet would run it
($(VAR) expanded from the pod's environment, the downward API filled in,
envFrom Secrets supplied), goes through `mira <role> --check-config`: a
flag a template misspells, a value a role refuses, or a role the binary
does not have fails here instead of in a crash-looping pod."""

import os
import subprocess

import pytest

from chart import (MIRA, VARIANTS, command_line, mounted_secrets, pod_env, pod_names, rendered_variant,
                   rewrite_mounts, secure_secrets, workloads, write_mounts)

# What the test supplies for the Secrets the values name as pre-existing.
SECRETS = {
    "mira-s3": {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"},
    "mira-azure": {"AZURE_STORAGE_ACCOUNT_KEY": "dGVzdA=="},
}


def cases():
    out = []
    for variant in VARIANTS:
        for w in workloads(rendered_variant(variant)):
            pod, ordinal = pod_names(w)[-1]
            out.append(pytest.param(variant, w["metadata"]["name"], pod, ordinal, id=f"{variant}-{w['metadata']['name']}"))
    return out


@pytest.mark.parametrize("variant,workload,pod,ordinal", cases())
def test_rendered_command_line_passes_check_config(variant, workload, pod, ordinal, tmp_path):
    objs = rendered_variant(variant)
    (w,) = [o for o in objs if o["metadata"]["name"] == workload and o["kind"] in ("Deployment", "StatefulSet")]
    env = pod_env(w, pod, secrets=SECRETS, ordinal=ordinal)
    # Mounted Secrets (the cluster secret, tokens, TLS) as files, where the
    # kubelet would put them; cert-manager's Secret made by the test.
    # The ha-hpa variant's offload credentials: no file check-config reads.
    provided = dict(secure_secrets(), **{"mira-archive": {}})
    dirs = write_mounts(mounted_secrets(objs, w, provided), str(tmp_path))
    argv = [rewrite_mounts(a, dirs) for a in command_line(w, pod, env)]
    assert not any("$(" in a for a in argv), f"unexpanded variable in {argv}"
    assert not any("/etc/mira/" in a for a in argv), f"a path the test does not map: {argv}"
    # Only what the pod would have: its environment and a PATH.
    run_env = dict(env, PATH=os.environ.get("PATH", "/usr/bin:/bin"))
    r = subprocess.run([MIRA] + argv + ["--check-config"], env=run_env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"mira {' '.join(argv)} --check-config:\n{r.stderr[-3000:]}"
    # The effective configuration reflects what the chart meant.
    if argv[0] == "catalog":
        assert f"node_id = {ordinal}" in r.stdout, r.stdout
    if argv[0] == "ingester":
        assert f'id = "{pod}"' in r.stdout, r.stdout


def test_check_config_catches_a_misspelt_flag():
    """The check above is not vacuous: a template typo fails it."""
    r = subprocess.run([MIRA, "querier", "--cache-szie=1GiB", "--check-config"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "--cache-szie" in r.stderr
