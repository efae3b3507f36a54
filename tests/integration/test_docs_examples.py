"""The docs' dry-run examples are what ddl prints (issue 24 item 8), doctest-style.

README.md and every page of docs/ (docs/sites/ included) are read for two kinds of example:
- a fenced block written as a terminal session: `$ cat ~/.config/ddl/sites/NAME.json` followed by the
  file's text writes that profile (in a scratch home that stands for /home/alice, for the commands after it in the same
  block); `$ ddl ... --dry-run ...` followed by its output must print exactly that (stdout, then
  stderr: the error examples show ddl's error lines);
- the broken-profile catalogue: `NAME.json: TEXT` and the error lines under it are what
  `ddl sites show NAME` says of a file holding TEXT;
- a fenced block that is a script (`#!/bin/bash`): the `ddl submit` or `ddl jupyter start` command
  nearest before it (in a code block or in the prose's inline code) is run with `--dry-run` and must
  print exactly that script, with `ddl` standing for the path of the binary (as the pages say).
A doc whose example ddl no longer prints fails here, naming the file, the line and the first line
that differs."""
import os
import re
import shlex
import subprocess
import tempfile
import unittest

from ddl_testing import DDL, SOURCE


def doc_files():
    files = [os.path.join(SOURCE, "README.md")]
    for root, _dirs, names in os.walk(os.path.join(SOURCE, "docs")):
        files += [os.path.join(root, n) for n in sorted(names) if n.endswith(".md")]
    return sorted(files)


def segments(path):
    """The file as [("prose", first line, text) | ("code", first line, [lines])], in order."""
    found, prose, code, start = [], [], None, 1
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if line.startswith("```"):
                if code is None:
                    found.append(("prose", start, "\n".join(prose)))
                    code, start = [], number + 1
                else:
                    found.append(("code", start, code))
                    code, prose, start = None, [], number + 1
            elif code is not None:
                code.append(line)
            else:
                prose.append(line)
    return found


def blocks(path):
    """[(first line number, [lines])] of the file's fenced code blocks."""
    return [(start, body) for kind, start, body in segments(path) if kind == "code"]


def write_profile(home, name, text):
    """The user profile NAME.json holding `text`, in the config folder of `home`."""
    sites = os.path.join(home, ".config", "ddl", "sites")
    os.makedirs(sites, exist_ok=True)
    with open(os.path.join(sites, name + ".json"), "w") as f:
        f.write(text + "\n")


def ddl_at_home(args, home):
    """This build's ddl run with `home` as the user's home (and config folder under it), outside any
    allocation, in a scratch folder."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PBS_", "DDL_"))}
    env.update(HOME=home, XDG_CONFIG_HOME=os.path.join(home, ".config"))
    env.pop("XDG_STATE_HOME", None)
    with tempfile.TemporaryDirectory() as cwd:
        return subprocess.run([DDL, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


PROFILE_EXAMPLE = re.compile(r"^(\w+)\.json(?: \(an override\))?: (.+)$")
USUAL_PROFILE_HINT = "hint: fix the field (docs/site-profiles.md describes each one), or remove the file to use the built-in profile"
SCRIPT_COMMANDS = (["ddl", "submit"], ["ddl", "jupyter", "start"])


def commands_in(segment):
    """The ddl submit / jupyter start commands a segment shows, in order."""
    kind, _start, body = segment
    if kind == "code":
        candidates = [line[2:] if line.startswith("$ ") else line for line in body]
    else:
        candidates = re.findall(r"`([^`]+)`", body.replace("\n", " "))
    found = []
    for text in candidates:
        text = text.split("#")[0].strip()
        try:
            words = shlex.split(text)
        except ValueError:
            continue
        if any(words[:len(c)] == c for c in SCRIPT_COMMANDS):
            found.append(words)
    return found


def with_dry_run(words):
    if "--dry-run" in words:
        return words
    n = 3 if words[1] == "jupyter" else 2
    return words[:n] + ["--dry-run"] + words[n:]


def sessions(lines):
    """[(offset, command, [output lines])]: each `$ ` line of a block with the lines after it."""
    steps = []
    for offset, line in enumerate(lines):
        if line.startswith("$ "):
            steps.append((offset, line[2:], []))
        elif steps:
            steps[-1][2].append(line)
    return steps


class DryRunExamples(unittest.TestCase):
    def test_every_dry_run_example_in_the_docs_is_what_ddl_prints(self):
        checked, problems = 0, []
        for path in doc_files():
            for start, lines in blocks(path):
                with tempfile.TemporaryDirectory() as config:
                    for offset, command, output in sessions(lines):
                        where = f"{os.path.relpath(path, SOURCE)}:{start + offset}"
                        words = shlex.split(command)
                        if words[:1] == ["cat"] and len(words) == 2 and words[1].startswith("~/.config/ddl/sites/"):
                            write_profile(config, os.path.basename(words[1])[:-len(".json")], "\n".join(output))
                        elif words[:1] == ["ddl"] and "--dry-run" in words:
                            checked += 1
                            problem = self.differs(words, output, config)
                            if problem:
                                problems.append(f"{where}: `{command}`: {problem}")
            checked += self.check_scripts(path, problems)
            checked += self.check_profile_errors(path, problems)
        self.assertGreaterEqual(checked, 24, "the docs' dry-run examples were not found")
        self.assertEqual(problems, [], "\n".join(problems))

    def check_scripts(self, path, problems):
        """Checks each script block of `path` against its command; returns how many it checked."""
        parts, checked = segments(path), 0
        for i, (kind, start, body) in enumerate(parts):
            if kind != "code" or not body or not body[0].startswith("#!") or any(l.startswith("$ ") for l in body):
                continue
            command = next((c[-1] for c in map(commands_in, reversed(parts[:i])) if c), None)
            where = f"{os.path.relpath(path, SOURCE)}:{start}"
            if command is None:
                problems.append(f"{where}: a script with no ddl submit/jupyter start command before it")
                continue
            checked += 1
            with tempfile.TemporaryDirectory() as config:
                problem = self.differs(with_dry_run(command), body, config)
            if problem:
                problems.append(f"{where}: `{shlex.join(with_dry_run(command))}`: {problem}")
        return checked

    def check_profile_errors(self, path, problems):
        """The broken-profile catalogue (site-profiles.md): each `NAME.json: TEXT` line and the error
        lines under it are what `ddl sites show NAME` says of a file holding TEXT, with the user's
        config folder shown as /tmp/x and the usual hint left out where the doc shows none."""
        checked = 0
        for start, lines in blocks(path):
            for offset, line in enumerate(lines):
                m = PROFILE_EXAMPLE.match(line)
                if not m:
                    continue
                expected = []
                for following in lines[offset + 1:]:
                    if not following:
                        break
                    expected.append(following)
                checked += 1
                with tempfile.TemporaryDirectory() as home:
                    write_profile(home, m.group(1), m.group(2))
                    result = ddl_at_home(["sites", "show", m.group(1)], home)
                    said = result.stderr.replace(os.path.join(home, ".config"), "/tmp/x").rstrip("\n").split("\n")
                if len(expected) == 1 and said[1:] == [USUAL_PROFILE_HINT]:
                    said = said[:1]
                if result.returncode != 2 or said != expected:
                    problems.append(f"{os.path.relpath(path, SOURCE)}:{start + offset}: `ddl sites show {m.group(1)}` "
                                    f"(exit {result.returncode}) says\n    {said!r}\n  where the doc says\n    {expected!r}")
        return checked

    @staticmethod
    def differs(words, documented, config):
        """None when ddl prints `documented`, run with HOME at `config` (standing for /home/alice)."""
        result = ddl_at_home(words[1:], config)
        # The pages show the binary as `ddl` and the user's home as alice's.
        printed = (result.stdout + result.stderr).replace(os.path.realpath(DDL), "ddl").replace(config, "/home/alice")
        printed = printed.rstrip("\n").split("\n")
        while documented and documented[-1] == "":
            documented = documented[:-1]
        if printed == documented:
            return None
        for i, (want, got) in enumerate(zip(documented, printed)):
            if want != got:
                return f"output line {i + 1} is\n    {got!r}\n  where the doc says\n    {want!r}"
        return (f"ddl prints {len(printed)} lines where the doc shows {len(documented)} "
                f"(the first {min(len(printed), len(documented))} agree; ddl's last: {printed[-1]!r})")


if __name__ == "__main__":
    unittest.main()
