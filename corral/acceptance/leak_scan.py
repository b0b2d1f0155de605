"""The secret scan (seed 004 V1.1 §5.9, secret_leak_count = 0): the planted decoys,
exactly, and anything corral's one redaction path (corral/core/redact.py) takes for
a secret, over the ledger's bytes, the logs and the transcripts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from corral.core.redact import REDACTED, redact_text


@dataclass
class LeakScan:
    files: int = 0
    #: Where a planted decoy was found, as "file: decoy prefix".
    decoy_hits: list[str] = field(default_factory=list)
    #: Where the redaction rules found a secret-shaped value in the decoys' neighbourhood.
    pattern_hits: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.decoy_hits) + len(self.pattern_hits)


def scan(paths: list[Path], decoys: tuple[str, ...]) -> LeakScan:
    """Every file under ``paths``. A decoy found anywhere (bytes, not only text) is a
    leak; so is a text line the redaction rules would redact that the redaction path
    should have caught (an API-key-shaped value: the rules' own families)."""
    result = LeakScan()
    for root in paths:
        files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
        for file in files:
            try:
                data = file.read_bytes()
            except OSError:
                continue
            result.files += 1
            found = [decoy for decoy in decoys if decoy.encode() in data]
            result.decoy_hits += [f"{file}: {decoy[:6]}…" for decoy in found]
            if found:
                continue  # one leak of a file is counted once, by what it leaked
            text = data.decode("utf-8", errors="replace")
            for line in text.splitlines():
                if "sk-" in line and REDACTED in redact_text(line) and REDACTED not in line:
                    result.pattern_hits.append(f"{file}: an API-key-shaped value")
                    break
    return result
