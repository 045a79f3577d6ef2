"""CPU seconds a bench case spends, by who spent them: pods' cgroups, processes' sessions, /proc/stat.

A ``Sample`` is read at a case's start and at its end (``sample``); ``account`` turns two samples into
a ``CpuRow`` (pure), ``table`` prints the rows. Sources, all cumulative counters read twice:

- the machine: /proc/stat's ``cpu`` line, every state but idle and iowait, in USER_HZ;
- pods: the real node's kubelet (cgroupfs driver) puts each pod in ``<root>/kubepods[/<qos>]/pod<uid>``
  with a folder per container named by its ID (``cpuacct.usage`` in cgroup v1, ns; ``cpu.stat``
  ``usage_usec`` in v2); kubepods' own counter keeps what removed pods spent;
- processes started in a session of their own (the node cache, seaweedfs, the operator, the cluster's
  components): utime + stime of every live process of that session (/proc/PID/stat; not cutime and
  cstime: containerd reaps the shims, which reaped the containers' processes, so a removed pod's whole
  life would land there);
- the bench itself: ``os.times()`` (it and the children it waited for: kubectl);
- every other process outside the pods (by /proc/PID/cgroup): utime + stime by its command line, for
  the rest of the machine's largest parts.

Nothing here fails a bench: a counter that cannot be read is None, printed "-", with the reason once.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PROCESS_PARTS = ("node cache", "store", "operator", "cluster")
"""The parts read from processes' sessions, in the table's order."""
COLUMNS = (
    "tritonserver",
    "agent",
    "rest of the pods",
    "other pods",
    *PROCESS_PARTS,
    "bench",
    "rest of the machine",
)


@dataclass(frozen=True)
class Sample:
    """Cumulative CPU seconds at one moment: the machine's busy time over ``cores``; ``pods`` by pod UID,
    each {"": the whole pod, container ID: the container}; ``all_pods``: kubepods' own counter;
    ``parts``: the named process parts and "bench"; None where it could not be read."""

    busy: float | None
    cores: int
    pods: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    all_pods: float | None = None
    parts: Mapping[str, float | None] = field(default_factory=dict)
    others: Mapping[tuple[int, int], tuple[str, float]] = field(default_factory=dict)
    """Every other live process outside the pods: (pid, start time) -> (its command, CPU seconds)."""


@dataclass(frozen=True)
class CpuRow:
    """One case's CPU seconds by column (None: not measured), the busy total, the cores, the seconds."""

    case: str
    seconds: float
    cores: int
    busy: float | None
    columns: Mapping[str, float | None]
    per_pod: Sequence[tuple[str, float, float]] = ()
    """Each of the case's pods: (name, tritonserver, agent) seconds."""
    rest_top: Sequence[tuple[str, float]] = ()
    """The rest of the machine's largest parts: (command, CPU seconds), largest first."""

    @property
    def floor(self) -> float | None:
        """The case's floor on this machine: every busy CPU second of it spread over every core."""
        return None if self.busy is None or self.cores < 1 else self.busy / self.cores

    @property
    def own(self) -> float | None:
        """CPU seconds of what the case needs: every column but the bench and the rest of the machine."""
        values = [v for k, v in self.columns.items() if k not in ("bench", "rest of the machine")]
        return None if any(v is None for v in values) else sum(v for v in values if v is not None)


# ---------------------------------------------------------------- parsing (pure)


def busy_seconds(proc_stat: str, hz: int) -> tuple[float | None, int]:
    """The machine's busy CPU seconds (user, nice, system, irq, softirq, steal: not idle, not iowait;
    guest time is already in user) and its CPUs, from /proc/stat's text."""
    busy: float | None = None
    cores = 0
    for line in proc_stat.splitlines():
        words = line.split()
        if not words:
            continue
        if words[0] == "cpu":
            ticks = [int(w) for w in words[1:9]] + [0] * (8 - len(words[1:9]))
            user, nice, system, _idle, _iowait, irq, softirq, steal = ticks
            busy = (user + nice + system + irq + softirq + steal) / hz
        elif words[0].startswith("cpu") and words[0][3:].isdigit():
            cores += 1
    return busy, cores


def process_stat(text: str, hz: int) -> tuple[int, float, int] | None:
    """(session, utime + stime seconds, start time) from /proc/PID/stat's text; None when it is not
    one (the command name, in parentheses, may hold spaces and parentheses: the fields follow its
    last ')')."""
    _, paren, rest = text.rpartition(")")
    fields = rest.split()
    if not paren or len(fields) < 20:
        return None
    try:
        session = int(fields[3])
        seconds = (int(fields[11]) + int(fields[12])) / hz
        start = int(fields[19])
    except ValueError:
        return None
    return session, seconds, start


def session_seconds(stats: Iterable[tuple[int, float]], sessions: Iterable[int]) -> float:
    """CPU seconds of every process in ``sessions``, from (session, seconds) pairs."""
    wanted = set(sessions)
    return sum(seconds for session, seconds in stats if session in wanted)


def pod_uid(folder: str) -> str | None:
    """The pod UID a kubelet cgroup folder is named for: ``pod<uid>`` (cgroupfs driver) or
    ``kubepods-<qos>-pod<uid with _>.slice`` (systemd driver); None for any other folder."""
    name = folder.removesuffix(".slice")
    head, sep, uid = name.rpartition("pod")
    if not sep or (head and not head.endswith("-")) or len(uid) != 36:
        return None
    return uid.replace("_", "-")


def command(cmdline: bytes, width: int = 60) -> str:
    """A process's command line for the table (/proc/PID/cmdline: NUL-separated), cut at ``width``;
    kernel threads (softirq and writeback work among them) have none."""
    words = [w.decode(errors="replace") for w in cmdline.split(b"\0") if w]
    if not words:
        return "[kernel threads]"
    words[0] = words[0].rpartition("/")[2]
    text = " ".join(words)
    return text if len(text) <= width else text[: width - 3] + "..."


def largest(
    before: Mapping[tuple[int, int], tuple[str, float]],
    after: Mapping[tuple[int, int], tuple[str, float]],
    n: int = 5,
) -> list[tuple[str, float]]:
    """The ``n`` commands that spent the most CPU seconds between two samples (a process started
    between them counts from 0), by command, largest first; none under 0.05 s."""
    spent: dict[str, float] = {}
    for key, (cmd, seconds) in after.items():
        was = before.get(key, (cmd, 0.0))[1]
        spent[cmd] = spent.get(cmd, 0.0) + max(seconds - was, 0.0)
    ranked = sorted(spent.items(), key=lambda kv: -kv[1])
    return [(cmd, s) for cmd, s in ranked[:n] if s >= 0.05]


def container_id(folder: str) -> str:
    """The container ID a pod's cgroup folder is named for: itself (cgroupfs) or
    ``cri-containerd-<id>.scope`` (systemd)."""
    return folder.removesuffix(".scope").rpartition("-")[2]


def usage_seconds(text: str, v1: bool) -> float | None:
    """A cgroup's CPU seconds: cgroup v1 ``cpuacct.usage`` (ns), v2 ``cpu.stat`` (usage_usec)."""
    try:
        if v1:
            return int(text.strip()) / 1e9
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
    except ValueError:
        return None
    return None


# ---------------------------------------------------------------- two samples -> a row (pure)


def delta(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else max(after - before, 0.0)


def account(
    case: str,
    seconds: float,
    before: Sample,
    after: Sample,
    pods: Sequence[tuple[str, str, Mapping[str, str]]],
) -> CpuRow:
    """The case's row: ``pods`` are the case's pods as (name, uid, {container ID: container name});
    each pod's counters count from 0 where it was not there at the start. "rest of the pods": what
    they spent beside tritonserver and the agent (the sandbox, an init container); "other pods":
    every other pod on the node (those the case deletes included), from kubepods' own counter; "rest
    of the machine": the busy total less every other column."""
    columns: dict[str, float | None] = dict.fromkeys(COLUMNS)
    per_pod: list[tuple[str, float, float]] = []
    case_pods: float | None = 0.0
    server = agent = rest = 0.0
    for name, uid, containers in pods:
        now = after.pods.get(uid)
        if now is None or "" not in now:
            case_pods = None
            continue
        was = before.pods.get(uid, {})
        spent = {key: max(value - was.get(key, 0.0), 0.0) for key, value in now.items()}
        mine = {"tritonserver": 0.0, "agent": 0.0}
        for cid, container in containers.items():
            if container in mine and cid in spent:
                mine[container] += spent[cid]
        per_pod.append((name, mine["tritonserver"], mine["agent"]))
        server += mine["tritonserver"]
        agent += mine["agent"]
        rest += spent[""] - mine["tritonserver"] - mine["agent"]
        if case_pods is not None:
            case_pods += spent[""]
    if case_pods is not None and pods:
        columns.update({"tritonserver": server, "agent": agent, "rest of the pods": max(rest, 0.0)})
        all_pods = delta(after.all_pods, before.all_pods)
        columns["other pods"] = None if all_pods is None else max(all_pods - case_pods, 0.0)
    for part in (*PROCESS_PARTS, "bench"):
        columns[part] = delta(after.parts.get(part), before.parts.get(part))
    busy = delta(after.busy, before.busy)
    known = [v for k, v in columns.items() if k != "rest of the machine"]
    if busy is not None and all(v is not None for v in known):
        columns["rest of the machine"] = max(busy - sum(v for v in known if v is not None), 0.0)
    return CpuRow(case, seconds, after.cores, busy, columns, per_pod, largest(before.others, after.others))


def cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def table(rows: Sequence[CpuRow]) -> list[str]:
    """The rows as a Markdown table: CPU seconds per column, the busy total, the floor (busy / cores),
    what the case needs / cores, and the case's seconds."""
    cores = rows[0].cores if rows else 0
    head = [
        "case",
        *COLUMNS,
        "busy (all)",
        f"floor: busy / {cores}",
        f"needed / {cores}",
        "apply -> every pod answers",
    ]
    out = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for r in rows:
        own = None if r.own is None or r.cores < 1 else r.own / r.cores
        cells = [cell(r.columns.get(c)) for c in COLUMNS]
        out.append(
            f"| {r.case} | "
            + " | ".join(cells)
            + f" | {cell(r.busy)} | {cell(r.floor)} | {cell(own)} | **{r.seconds:.1f}** |"
        )
    return out


# ---------------------------------------------------------------- reading the counters (I/O)


def cgroup_mounts() -> list[tuple[Path, bool]]:
    """The mounts to read pods' CPU from, cgroup v1's cpuacct first, then cgroup v2: (path, is v1)."""
    v1: list[tuple[Path, bool]] = []
    v2: list[tuple[Path, bool]] = []
    try:
        mounts = Path("/proc/mounts").read_text()
    except OSError:
        return []
    for line in mounts.splitlines():
        words = line.split()
        if len(words) < 4:
            continue
        if words[2] == "cgroup" and "cpuacct" in words[3].split(","):
            v1.append((Path(words[1]), True))
        elif words[2] == "cgroup2":
            v2.append((Path(words[1]), False))
    return v1 + v2


def find_kubepods(mounts: Sequence[tuple[Path, bool]], depth: int = 3) -> tuple[Path, bool] | None:
    """The first ``kubepods`` (or ``kubepods.slice``) folder within ``depth`` levels of a mount."""
    for mount, v1 in mounts:
        level = [mount]
        for _ in range(depth):
            nxt: list[Path] = []
            for d in level:
                try:
                    children = [c for c in d.iterdir() if c.is_dir()]
                except OSError:
                    continue
                for c in children:
                    if c.name in ("kubepods", "kubepods.slice"):
                        return c, v1
                nxt.extend(children)
            level = nxt
    return None


def read_usage(folder: Path, v1: bool) -> float | None:
    try:
        return usage_seconds((folder / ("cpuacct.usage" if v1 else "cpu.stat")).read_text(), v1)
    except OSError:
        return None


def read_pods(kubepods: Path, v1: bool) -> dict[str, dict[str, float]]:
    """Every pod's cgroup below ``kubepods`` (itself or a QoS folder): {uid: {"": pod, cid: container}}."""
    out: dict[str, dict[str, float]] = {}
    folders = [kubepods]
    try:
        folders += [d for d in kubepods.iterdir() if d.is_dir() and pod_uid(d.name) is None]
    except OSError:
        return out
    for parent in folders:
        try:
            pods = [d for d in parent.iterdir() if d.is_dir() and pod_uid(d.name) is not None]
        except OSError:
            continue
        for pod in pods:
            total = read_usage(pod, v1)
            if total is None:
                continue
            counters = {"": total}
            try:
                children = [c for c in pod.iterdir() if c.is_dir()]
            except OSError:
                children = []
            for c in children:
                usage = read_usage(c, v1)
                if usage is not None:
                    counters[container_id(c.name)] = usage
            out[str(pod_uid(pod.name))] = counters
    return out


def process_stats(hz: int) -> dict[int, tuple[int, float, int]]:
    """pid -> (session, CPU seconds, start time) of every process on this machine now."""
    out: dict[int, tuple[int, float, int]] = {}
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return out
    for pid in entries:
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue  # gone meanwhile
        got = process_stat(text, hz)
        if got is not None:
            out[int(pid)] = got
    return out


def other_processes(
    stats: Mapping[int, tuple[int, float, int]], sessions: set[int], me: int
) -> dict[tuple[int, int], tuple[str, float]]:
    """The processes outside ``sessions``, this one and the pods' cgroups: (pid, start) -> (command,
    CPU seconds)."""
    out: dict[tuple[int, int], tuple[str, float]] = {}
    for pid, (session, seconds, start) in stats.items():
        if session in sessions or pid == me:
            continue
        try:
            if "kubepods" in Path(f"/proc/{pid}/cgroup").read_text():
                continue
            cmd = command(Path(f"/proc/{pid}/cmdline").read_bytes())
        except OSError:
            continue
        out[(pid, start)] = (cmd, seconds)
    return out


class Sampler:
    """Reads a ``Sample``; ``sessions`` names each process part's session leaders (a part that has none
    is None); why a counter could not be read goes to ``problems`` (each reason once)."""

    def __init__(self, sessions: Mapping[str, Sequence[int]]) -> None:
        self.sessions = dict(sessions)
        self.hz = os.sysconf("SC_CLK_TCK")
        self.problems: list[str] = []
        found = find_kubepods(cgroup_mounts())
        self.kubepods = found
        if found is None:
            self.note("no kubepods cgroup folder under /sys/fs/cgroup (pods' columns not measured)")

    def note(self, why: str) -> None:
        if why not in self.problems:
            self.problems.append(why)

    def sample(self) -> Sample:
        busy: float | None = None
        cores = os.cpu_count() or 0
        try:
            busy, cores = busy_seconds(Path("/proc/stat").read_text(), self.hz)
        except OSError as e:
            self.note(f"/proc/stat: {e}")
        pods: dict[str, dict[str, float]] = {}
        all_pods: float | None = None
        if self.kubepods is not None:
            folder, v1 = self.kubepods
            pods = read_pods(folder, v1)
            all_pods = read_usage(folder, v1)
        stats = process_stats(self.hz)
        pairs = [(session, seconds) for session, seconds, _ in stats.values()]
        alive = {session for session, _ in pairs}
        parts: dict[str, float | None] = {}
        for part, leaders in self.sessions.items():
            if not leaders or not alive.intersection(leaders):
                self.note(f"{part}: no process of its session ({list(leaders)}) to read")
                parts[part] = None
            else:
                parts[part] = session_seconds(pairs, leaders)
        t = os.times()
        parts["bench"] = t.user + t.system + t.children_user + t.children_system
        known = {leader for leaders in self.sessions.values() for leader in leaders}
        others = other_processes(stats, known, os.getpid())
        return Sample(busy, cores, pods, all_pods, parts, others)
