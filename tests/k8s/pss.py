"""A checker of the Kubernetes Pod Security Standards' *restricted* profile (and the baseline
it includes), written from the standard's table of controls
(kubernetes.io/docs/concepts/security/pod-security-standards, v1.32), for pod specs the
operator renders. :func:`violations` returns one line per broken control, naming the field;
empty means a namespace labelled ``pod-security.kubernetes.io/enforce: restricted`` admits the
pod. It checks what a pod spec alone decides (not the image's user: a ``runAsNonRoot`` pod
without ``runAsUser`` is admitted, and the kubelet then checks the image).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

#: Volume types the restricted profile allows.
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}
#: Capabilities the baseline profile allows to add.
BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL",
                         "MKNOD", "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID",
                         "SYS_CHROOT"}
#: Sysctls the baseline profile allows.
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
                "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t",
                 "container_engine_t"}


def _containers(spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for i, c in enumerate(spec.get(key) or []):
            yield f"spec.{key}[{i}]", c


def violations(pod_spec: dict[str, Any]) -> list[str]:
    """Every control of the restricted profile ``pod_spec`` breaks."""
    out: list[str] = []
    psc = pod_spec.get("securityContext") or {}
    # ---- baseline ------------------------------------------------------------------------
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(key):
            out.append(f"spec.{key} must be unset or false")
    for i, v in enumerate(pod_spec.get("volumes") or []):
        if "hostPath" in v:
            out.append(f"spec.volumes[{i}] is a hostPath volume")
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"spec.volumes[{i}] has a type the restricted profile forbids "
                       f"({', '.join(sorted(kinds - RESTRICTED_VOLUMES))})")
    for s in psc.get("sysctls") or []:
        if s.get("name") not in SAFE_SYSCTLS:
            out.append(f"spec.securityContext.sysctls: {s.get('name')} is not a safe sysctl")
    if (psc.get("seLinuxOptions") or {}).get("type", "") not in SELINUX_TYPES:
        out.append("spec.securityContext.seLinuxOptions.type is not allowed")
    if (psc.get("appArmorProfile") or {}).get("type") == "Unconfined":
        out.append("spec.securityContext.appArmorProfile must not be Unconfined")
    if psc.get("runAsUser") == 0:
        out.append("spec.securityContext.runAsUser must not be 0")
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    if pod_seccomp == "Unconfined":
        out.append("spec.securityContext.seccompProfile must not be Unconfined")
    pod_non_root = psc.get("runAsNonRoot")
    for where, c in _containers(pod_spec):
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            out.append(f"{where}.securityContext.privileged must be false")
        caps = sc.get("capabilities") or {}
        added = set(caps.get("add") or [])
        if not added <= BASELINE_CAPABILITIES:
            out.append(f"{where}.securityContext.capabilities.add has "
                       f"{', '.join(sorted(added - BASELINE_CAPABILITIES))}")
        for p in c.get("ports") or []:
            if p.get("hostPort"):
                out.append(f"{where}.ports: hostPort {p['hostPort']} is not allowed")
        if sc.get("procMount", "Default") != "Default":
            out.append(f"{where}.securityContext.procMount must be Default")
        if (sc.get("seLinuxOptions") or {}).get("type", "") not in SELINUX_TYPES:
            out.append(f"{where}.securityContext.seLinuxOptions.type is not allowed")
        if (sc.get("appArmorProfile") or {}).get("type") == "Unconfined":
            out.append(f"{where}.securityContext.appArmorProfile must not be Unconfined")
        # ---- restricted --------------------------------------------------------------------
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{where}.securityContext.allowPrivilegeEscalation must be false")
        non_root = sc.get("runAsNonRoot", pod_non_root)
        if non_root is not True:
            out.append(f"{where}.securityContext.runAsNonRoot must be true (here or in "
                       "spec.securityContext)")
        if sc.get("runAsUser") == 0:
            out.append(f"{where}.securityContext.runAsUser must not be 0")
        seccomp = (sc.get("seccompProfile") or {}).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{where}.securityContext.seccompProfile must be RuntimeDefault or "
                       "Localhost (here or in spec.securityContext)")
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{where}.securityContext.capabilities.drop must include ALL")
        if not added <= {"NET_BIND_SERVICE"}:
            out.append(f"{where}.securityContext.capabilities.add may only have "
                       "NET_BIND_SERVICE")
    return out


def read_only_root(pod_spec: dict[str, Any]) -> list[str]:
    """Containers without a read-only root file system (not a Pod Security control, but the
    operator's own rule for what it creates)."""
    return [where for where, c in _containers(pod_spec)
            if (c.get("securityContext") or {}).get("readOnlyRootFilesystem") is not True]
