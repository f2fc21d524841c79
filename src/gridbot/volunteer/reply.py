"""The scheduler reply the stock client reads (shared/reference/boinc-client-protocol.md, section 2.2).

Built as text, every value escaped: the client's parser is line- and tag-oriented and ignores what it does
not know, so only the tags it needs are written, one a line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from xml.sax.saxutils import escape

API_VERSION = "7.20.0"
"""The BOINC API the app version declares: from 6 on, the client maps the task's shared memory as the file
`boinc_mmap_file` in its slot (before 6, a System V segment a shell script cannot read), through which the wrapper
takes the client's suspend and resume (volunteer/wrapper.py)."""


@dataclass(frozen=True)
class FileInfo:
    """A `<file_info>`: a download (`url`) or an upload (`upload_url` with its size limit and token)."""

    name: str
    url: str = ""
    nbytes: int = 0
    md5: str = ""
    executable: bool = False
    signature: str = ""
    upload_url: str = ""
    max_nbytes: int = 0
    upload_token: str = ""

    def xml(self) -> str:
        parts = [f"<file_info>\n    <name>{escape(self.name)}</name>"]
        if self.url:
            parts.append(f"    <url>{escape(self.url)}</url>")
        if self.upload_url:
            parts.append(f"    <upload_url>{escape(self.upload_url)}</upload_url>")
            parts.append(f"    <max_nbytes>{self.max_nbytes}</max_nbytes>")
            parts.append(f"    <xml_signature>\n{escape(self.upload_token)}\n</xml_signature>")
        if self.nbytes or self.md5:
            parts.append(f"    <nbytes>{self.nbytes}</nbytes>\n    <md5_cksum>{self.md5}</md5_cksum>")
        if self.executable:
            parts.append("    <executable/>")
        if self.signature:
            parts.append(f"    <file_signature>\n{self.signature}</file_signature>")
        parts.append("</file_info>")
        return "\n".join(parts)


@dataclass(frozen=True)
class Work:
    """One instance as a workunit and its result."""

    result: str
    workunit: str
    inputs: list[tuple[str, str]]
    """(file name, open name) of each input, the job file first."""
    output: str
    report_deadline: int
    fpops_est: float
    fpops_bound: float
    memory_bound: float
    disk_bound: float

    def xml(self, app: str, version: int, platform: str) -> str:
        refs = "".join(f"    <file_ref>\n        <file_name>{escape(n)}</file_name>\n"
                       f"        <open_name>{escape(o)}</open_name>\n        <copy_file/>\n    </file_ref>\n"
                       for n, o in self.inputs)
        return (f"<workunit>\n    <name>{escape(self.workunit)}</name>\n    <app_name>{app}</app_name>\n"
                f"    <rsc_fpops_est>{self.fpops_est:.0f}</rsc_fpops_est>\n"
                f"    <rsc_fpops_bound>{self.fpops_bound:.0f}</rsc_fpops_bound>\n"
                f"    <rsc_memory_bound>{self.memory_bound:.0f}</rsc_memory_bound>\n"
                f"    <rsc_disk_bound>{self.disk_bound:.0f}</rsc_disk_bound>\n{refs}</workunit>\n"
                f"<result>\n    <name>{escape(self.result)}</name>\n    <wu_name>{escape(self.workunit)}</wu_name>\n"
                f"    <platform>{escape(platform)}</platform>\n    <version_num>{version}</version_num>\n"
                f"    <report_deadline>{self.report_deadline}</report_deadline>\n"
                f"    <file_ref>\n        <file_name>{escape(self.output)}</file_name>\n"
                f"        <open_name>gridbot_result</open_name>\n        <copy_file/>\n    </file_ref>\n"
                f"    <report_immediately/>\n</result>\n")


@dataclass
class Reply:
    """A scheduler reply being put together."""

    project_name: str
    next_rpc_delay: float | None = None
    request_delay: float | None = None
    hostid: int | None = None
    code_sign_key: str = ""
    messages: list[tuple[str, str]] = field(default_factory=list)
    """(priority, text): `notice`, `low` or `high` (shown in the client's event log)."""
    app: tuple[str, int, str, FileInfo, float] | None = None
    """(app name, version, platform, main program, flops), sent with any work."""
    files: list[FileInfo] = field(default_factory=list)
    work: list[Work] = field(default_factory=list)
    acks: list[str] = field(default_factory=list)
    aborts: list[str] = field(default_factory=list)

    def xml(self) -> bytes:
        out = ["<scheduler_reply>", f"<project_name>{escape(self.project_name)}</project_name>",
               "<scheduler_version>705</scheduler_version>"]
        if self.hostid is not None:
            out.append(f"<hostid>{self.hostid}</hostid>")
        if self.next_rpc_delay is not None:
            out.append(f"<next_rpc_delay>{self.next_rpc_delay:.0f}</next_rpc_delay>")
        if self.request_delay is not None:
            out.append(f"<request_delay>{self.request_delay:.0f}</request_delay>")
        for priority, text in self.messages:
            out.append(f'<message priority="{priority}">{escape(text)}</message>')
        if self.code_sign_key:
            out.append(f"<code_sign_key>\n{self.code_sign_key}</code_sign_key>")
        if self.app is not None and self.work:
            name, version, platform, main, flops = self.app
            out.append(f"<app>\n    <name>{name}</name>\n    <user_friendly_name>gridbot jobs</user_friendly_name>\n"
                       "</app>")
            out.append(main.xml())
            out.append(f"<app_version>\n    <app_name>{name}</app_name>\n    <version_num>{version}</version_num>\n"
                       f"    <platform>{escape(platform)}</platform>\n    <avg_ncpus>1</avg_ncpus>\n"
                       f"    <api_version>{API_VERSION}</api_version>\n"
                       f"    <flops>{flops:.0f}</flops>\n"
                       f"    <file_ref>\n        <file_name>{escape(main.name)}</file_name>\n"
                       "        <main_program/>\n    </file_ref>\n</app_version>")
            out.extend(f.xml() for f in self.files)
            out.extend(w.xml(name, version, platform) for w in self.work)
        out.extend(f"<result_ack>\n    <name>{escape(n)}</name>\n</result_ack>" for n in self.acks)
        out.extend(f"<result_abort>\n    <name>{escape(n)}</name>\n</result_abort>" for n in self.aborts)
        out.append("</scheduler_reply>\n")
        return "\n".join(out).encode()
