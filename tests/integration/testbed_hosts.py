"""Helpers for the tests on the hosts of scripts/testbed.sh (test_hosts, test_two_node_slurm)."""
import json
import os
import subprocess

from ddl_testing import SOURCE, lines_by_rank

TESTBED = os.path.join(SOURCE, "scripts", "testbed.sh")


def bed(*args, timeout=120):
    """`scripts/testbed.sh ARGS` to its end."""
    return subprocess.run(["bash", TESTBED, *args], capture_output=True, text=True, timeout=timeout)


def workers(stdout):
    """The workers' JSON lines, by rank."""
    found = {}
    for rank, lines in lines_by_rank(stdout).items():
        for line in lines:
            if rank is not None and line.startswith("{"):
                found[rank] = json.loads(line)
    return found


LIGHTNING_PYTHON = os.environ.get("DDL_LIGHTNING_PYTHON") or "/var/cache/ddl/lightning-venv/bin/python"
LIGHTNING_TRAIN = os.path.join(SOURCE, "tests", "integration", "lightning_train.py")


def lightning_reports(stdout):
    """{ddl rank: (Lightning's global rank, world size, local rank, node rank, weights hash)} from
    lightning_train.py's "lightning rank R of W local L node N weights H" lines."""
    reports = {}
    for rank, lines in lines_by_rank(stdout).items():
        for line in lines:
            if rank is not None and line.startswith("lightning rank "):
                words = line.split()
                reports[rank] = (int(words[2]), int(words[4]), int(words[6]), int(words[8]), words[10])
    return reports
