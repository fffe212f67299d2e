"""YAML read in one place: the config files (`--config FILE`, a preset, RUN/config.yaml) and the
values of `--set KEY=VALUE`.

Whatever is wrong with a file (missing, a directory, bytes that are not UTF-8, a YAML syntax
error, a tab in the indentation, a document that is not a mapping) becomes a ConfigError of one
line naming the file and, where it is known, the line and column (`path:LINE:COLUMN: ...`, as
compilers write it), so the CLI exits 2 with that line instead of PyYAML's multi-line traceback.
"""

from __future__ import annotations

from typing import Any

import yaml

from spotrl.config import ConfigError
from spotrl.storage.paths import AnyPath, as_path


class YamlProblem(ValueError):
    """What is wrong with a YAML text (`what`), where (1-based line and column, None where unknown),
    and the construct it broke (`context`: "while parsing a flow sequence from line 3, column 15")."""

    def __init__(self, what: str, line: int | None = None, column: int | None = None, context: str = ""):
        super().__init__(what)
        self.what, self.line, self.column, self.context = what, line, column, context

    def located(self, source: str) -> str:
        """`source:LINE:COLUMN: what (context)`, with the parts that are known."""
        where = "".join(f":{n}" for n in (self.line, self.column) if n is not None)
        return f"{source}{where}: {self.what}" + (f" ({self.context})" if self.context else "")


def _line_and_column(text: str | bytes, offset: int) -> tuple[int, int]:
    newline = "\n" if isinstance(text, str) else b"\n"
    return text.count(newline, 0, offset) + 1, offset - (text.rfind(newline, 0, offset) + 1) + 1


def decode(data: bytes) -> str:
    """UTF-8 text (YAML's encoding for config files); a YamlProblem at the first byte that is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line, column = _line_and_column(data, err.start)
        raise YamlProblem(
            f"not UTF-8 text (byte 0x{data[err.start]:02x}); save the file as UTF-8", line, column
        ) from None


def _problem(err: yaml.YAMLError, text: str) -> YamlProblem:
    if isinstance(err, yaml.reader.ReaderError):  # a control character: PyYAML gives an offset, not a mark
        return YamlProblem(
            f"not valid YAML: unacceptable character #x{err.character:04x}: {err.reason}",
            *_line_and_column(text, err.position),
        )
    if not isinstance(err, yaml.MarkedYAMLError) or err.problem_mark is None:
        return YamlProblem(f"not valid YAML: {' '.join(str(err).split())}")
    what = f"not valid YAML: {err.problem}"
    if "'\\t'" in err.problem:  # the commonest cause by far, and PyYAML's words do not say it
        what += "; YAML indents with spaces, not tabs"
    # where the broken construct began (an unclosed bracket's line); a context without a mark, such as
    # "while scanning for the next token", says nothing the problem does not
    start = err.context_mark
    context = f"{err.context} from line {start.line + 1}, column {start.column + 1}" if err.context and start else ""
    return YamlProblem(what, err.problem_mark.line + 1, err.problem_mark.column + 1, context)


def parse(text: str) -> Any:
    """The YAML document in `text` (None when empty); a YamlProblem saying what is wrong and where."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise _problem(err, text) from None


def read_mapping(path: str | AnyPath) -> dict:
    """A YAML config file's mapping ({} for an empty file), local or on an object store; a ConfigError
    of one line naming the file, and the line and column where the YAML is wrong."""
    path = as_path(path)
    if path.is_dir():
        raise ConfigError(f"config file {path} is a directory, not a YAML file")
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = parse(decode(path.read_bytes()))
    except YamlProblem as problem:
        raise ConfigError(problem.located(str(path))) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping, not {type(data).__name__}")
    return data
