#!/usr/bin/env python3
"""Checks the links of README.md, the book (docs/src/**/*.md) and the
repository's other Markdown files, offline.

Every Markdown link and image (inline `[t](x)`, reference `[t][r]` with its
`[r]: x` definition, `<a href>` and `<img src>`) outside code is resolved:

- a relative path must name a file or directory of the repository, from the
  file that links to it (so a link into ../../DESIGN.md from docs/src/ is
  checked where GitHub would follow it);
- a `#anchor` must be a heading of its target page (or of the page itself):
  for a page outside the book, by GitHub's rule; for a book page, by both
  GitHub's and mdBook's, since the page is read in both places. An explicit
  `{#id}` on a heading counts for both;
- with --html DIR (the book as `mdbook build` wrote it), every anchor into a
  book page must also be an `id` in that page's HTML, so a difference between
  the rule here and mdBook's own shows up as a failure rather than a dead link;
- http(s) and mailto links are listed, not fetched (CI has no network).

With --html, links in the built pages that leave the book for a repository
Markdown file first get back the `.md` that mdBook turned into `.html`
(mdBook rewrites every relative `.md` link, even one outside src/), and then
every relative href and src of the built pages must name an existing file.

Paths given with --allow-missing may be absent (each is reported as such).
Exit status 1 on any broken link, naming file, line, link and why.
"""

from __future__ import annotations

import argparse
import html
import re
import sys
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

EXTERNAL = re.compile(r"^(https?|mailto|ftp):", re.I)
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
REF_DEF = re.compile(r"^ {0,3}\[([^\]]+)\]:[ \t]*<?([^\s>]+)>?")
EXPLICIT_ID = re.compile(r"[ \t]*\{#([^}\s]+)[^}]*\}[ \t]*$")
HTML_ATTR = re.compile(r"<(?:a|img)\b[^>]*?\b(?:href|src)=\"([^\"]*)\"", re.I)
HTML_ID = re.compile(r"\bid=\"([^\"]+)\"")
INCLUDE = re.compile(r"\{\{#(?:include|rustdoc_include|playground)\s+([^}:\s]+)(?::([^}\s]+))?\s*\}\}")


@dataclass
class Link:
    source: Path
    line: int
    target: str


@dataclass
class Report:
    broken: List[str] = field(default_factory=list)
    external: List[str] = field(default_factory=list)
    allowed_missing: List[str] = field(default_factory=list)
    checked: int = 0


def strip_code_spans(line: str) -> str:
    """Blanks inline code (`...`, ``...``) so links inside it are not links."""
    out, i = [], 0
    while i < len(line):
        if line[i] == "`":
            run = len(line[i:]) - len(line[i:].lstrip("`"))
            close = line.find("`" * run, i + run)
            if close < 0:
                out.append(line[i : i + run])
                i += run
                continue
            out.append(" " * (close + run - i))
            i = close + run
        else:
            out.append(line[i])
            i += 1
    return "".join(out)


def prose_lines(text: str) -> Iterator[Tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    fence: Optional[str] = None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * len(m.group(1))
            continue
        if fence is not None:
            if line.strip().startswith(fence) and set(line.strip()) == {fence[0]}:
                fence = None
            continue
        yield number, line


def inline_targets(line: str) -> Iterator[str]:
    """Targets of `[text](target)` and `![alt](target)` on one line, nested
    brackets in the text allowed; a title after the target is dropped."""
    i = 0
    while True:
        start = line.find("](", i)
        if start < 0:
            return
        depth, j = 1, start + 2
        while j < len(line) and depth:
            depth += {"(": 1, ")": -1}.get(line[j], 0)
            j += 1
        if depth == 0:
            inner = line[start + 2 : j - 1].strip()
            if inner.startswith("<") and ">" in inner:
                yield inner[1 : inner.index(">")]
            elif inner:
                yield inner.split()[0]
        i = start + 2


def links_of(path: Path) -> List[Link]:
    text = path.read_text(encoding="utf-8")
    refs: Dict[str, Tuple[int, str]] = {}
    used: List[Tuple[int, str]] = []
    found: List[Link] = []
    for number, raw in prose_lines(text):
        m = REF_DEF.match(raw)
        if m:
            refs[m.group(1).lower()] = (number, m.group(2))
            continue
        line = strip_code_spans(raw)
        for target in inline_targets(line):
            found.append(Link(path, number, target))
        for target in HTML_ATTR.findall(line):
            found.append(Link(path, number, html.unescape(target)))
        for m in re.finditer(r"<((?:https?|mailto):[^>\s]+)>", line):
            found.append(Link(path, number, m.group(1)))
        for m in re.finditer(r"\]\[([^\]]*)\]", line):
            used.append((number, m.group(1)))
    # mdBook's {{#include FILE[:ANCHOR]}} (code blocks too, where they are
    # usual): the file must exist and a named anchor be marked in it.
    for number, line in enumerate(text.splitlines(), 1):
        for m in INCLUDE.finditer(line):
            found.append(Link(path, number, f"{{{{#include}}}}{m.group(1)}" + (f":{m.group(2)}" if m.group(2) else "")))
    for number, name in used:
        key = name.lower()
        if key in refs:
            found.append(Link(path, refs[key][0], refs[key][1]))
        elif key:
            found.append(Link(path, number, f"[undefined reference: {name}]"))
    return found


def heading_text(raw: str) -> Tuple[str, Optional[str]]:
    """A heading's plain text as rendered, and its explicit `{#id}` if any."""
    explicit = None
    m = EXPLICIT_ID.search(raw)
    if m:
        explicit, raw = m.group(1), raw[: m.start()]
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = text.replace("`", "")
    text = re.sub(r"(\*\*|__|\*|_)(.+?)\1", r"\2", text)  # emphasis
    text = re.sub(r"\\(.)", r"\1", text)  # backslash escapes
    return html.unescape(text).strip(), explicit


def github_slug(text: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (letters,
    marks, digits, `_`, `-` and spaces stay), each space a hyphen."""
    kept = []
    for ch in text.lower():
        cat = unicodedata.category(ch)
        if ch in " -_" or cat[0] in "LMN" or cat == "Pc":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def mdbook_slug(text: str) -> str:
    """mdBook's `id_from_content` (mdbook-html 0.5): trimmed and lower-cased;
    alphanumerics, `_` and `-` stay, any whitespace becomes `-`, everything
    else is dropped."""
    kept = []
    for ch in text.strip().lower():
        if ch.isalnum() or ch in "_-":
            kept.append(ch)
        elif ch.isspace():
            kept.append("-")
    return "".join(kept)


def numbered(slugs: List[str]) -> Set[str]:
    """Both renderers number a repeated anchor: x, x-1, x-2, ..."""
    seen: Dict[str, int] = {}
    out = set()
    for slug in slugs:
        if slug in seen:
            seen[slug] += 1
            out.add(f"{slug}-{seen[slug]}")
        else:
            seen[slug] = 0
            out.add(slug)
    return out


def headings(path: Path) -> List[Tuple[str, Optional[str]]]:
    out = []
    previous = ""
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        m = ATX.match(line)
        if m:
            out.append(heading_text(m.group(2)))
        elif SETEXT.match(line) and previous.strip() and not previous.lstrip().startswith(("-", "*", "|")):
            out.append(heading_text(previous.strip()))
        previous = line
    return out


class Anchors:
    """Anchors of each page, computed once per page and rule."""

    def __init__(self, book_src: Path, html_dir: Optional[Path]) -> None:
        self.book_src = book_src.resolve()
        self.html_dir = html_dir
        self.cache: Dict[Path, List[Set[str]]] = {}

    def in_book(self, page: Path) -> bool:
        return self.book_src in page.resolve().parents

    def sets(self, page: Path) -> List[Set[str]]:
        """One set per rule the page must satisfy; an anchor must be in all."""
        if page not in self.cache:
            found = headings(page)
            explicit = {e for _, e in found if e}
            gh = numbered([github_slug(t) for t, e in found if not e]) | explicit
            rules = [gh]
            if self.in_book(page):
                rules.append(numbered([mdbook_slug(t) for t, e in found if not e]) | explicit)
                if self.html_dir is not None:
                    built = self.html_dir / page.resolve().relative_to(self.book_src).with_suffix(".html")
                    ids = set(HTML_ID.findall(built.read_text(encoding="utf-8"))) if built.is_file() else set()
                    rules.append(ids)
            self.cache[page] = rules
        return self.cache[page]


def check_include(link: Link, source: Path, root: Path, where: str, report: Report) -> None:
    path_part, _, anchor = link.target[len("{{#include}}"):].partition(":")
    target = (source.parent / path_part).resolve()
    if not target.is_file():
        report.broken.append(f"{where}: no such file to include")
    elif anchor and not re.fullmatch(r"[0-9]*(:[0-9]*)?", anchor):
        text = target.read_text(encoding="utf-8")
        if not (re.search(rf"ANCHOR:\s*{re.escape(anchor)}\b", text)
                and re.search(rf"ANCHOR_END:\s*{re.escape(anchor)}\b", text)):
            report.broken.append(f"{where}: no ANCHOR/ANCHOR_END `{anchor}` in {target.relative_to(root)}")


def check(files: List[Path], root: Path, anchors: Anchors, allow_missing: Set[Path]) -> Report:
    report = Report()
    root = root.resolve()
    for source in files:
        for link in links_of(source):
            report.checked += 1
            where = f"{source.resolve().relative_to(root)}:{link.line}: {link.target}"
            if link.target.startswith("[undefined reference"):
                report.broken.append(f"{where}: no such reference definition")
                continue
            if link.target.startswith("{{#include}}"):
                check_include(link, source, root, where, report)
                continue
            if EXTERNAL.match(link.target):
                report.external.append(where)
                continue
            if re.match(r"^[a-z][a-z0-9+.-]*:", link.target, re.I):
                report.broken.append(f"{where}: unknown scheme")
                continue
            path_part, _, anchor = link.target.partition("#")
            if path_part.startswith("/"):
                report.broken.append(f"{where}: absolute path (use a relative one)")
                continue
            target = (source.parent / path_part).resolve() if path_part else source.resolve()
            if root not in target.parents and target != root:
                report.broken.append(f"{where}: leaves the repository")
                continue
            if not target.exists():
                if target in allow_missing:
                    report.allowed_missing.append(where)
                else:
                    report.broken.append(f"{where}: no such file")
                continue
            if not anchor:
                continue
            if target.is_dir() or target.suffix != ".md":
                report.broken.append(f"{where}: an anchor into a file that is not Markdown")
                continue
            for rule in anchors.sets(target):
                if anchor not in rule:
                    near = sorted(s for s in rule if s[:4] == anchor[:4])[:5]
                    hint = f" (near: {', '.join(near)})" if near else ""
                    report.broken.append(f"{where}: no heading `#{anchor}` in {target.relative_to(root)}{hint}")
                    break
    return report


HREF = re.compile(r"\b(href|src)=\"([^\"#?]+)([^\"]*)\"")


def repoint_html(book: Path, root: Path) -> int:
    """In the built pages, a link that leaves the book for X.html where the
    repository has X.md (and no X.html) goes back to X.md. Returns how many."""
    book, root, changed = book.resolve(), root.resolve(), 0
    for page in book.rglob("*.html"):
        text = page.read_text(encoding="utf-8")

        def fix(m: "re.Match[str]") -> str:
            nonlocal changed
            target = (page.parent / m.group(2)).resolve()
            if (m.group(1) == "href" and target.suffix == ".html" and book not in target.parents
                    and not target.exists() and target.with_suffix(".md").is_file()):
                changed += 1
                return f'{m.group(1)}="{m.group(2)[:-5]}.md{m.group(3)}"'
            return m.group(0)

        new = HREF.sub(fix, text)
        if new != text:
            page.write_text(new, encoding="utf-8")
    return changed


def check_html(book: Path, root: Path) -> List[str]:
    """Relative hrefs and srcs of the built pages that name nothing."""
    broken = []
    for page in sorted(book.resolve().rglob("*.html")):
        for m in HREF.finditer(page.read_text(encoding="utf-8")):
            url = m.group(2)
            if re.match(r"^[a-z][a-z0-9+.-]*:|^//", url, re.I) or not url:
                continue
            if not (page.parent / url).resolve().exists():
                broken.append(f"{page.relative_to(root.resolve())}: {m.group(1)}={url}: no such file")
    return broken


SKIP_DIRS = {".git", "target", "book", "node_modules", ".venv", "venv", "dist", "build"}


def markdown_files(root: Path) -> List[Path]:
    """README.md, the book's chapters, and every other Markdown file of the
    repository (they link into the book too), built output left out."""
    found = []
    for path in sorted(root.rglob("*.md")):
        parts = path.relative_to(root).parts[:-1]
        if not any(p in SKIP_DIRS or p.startswith(".") for p in parts):
            found.append(path)
    return found


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--html", type=Path, help="the built book (docs/book), to check anchors against")
    parser.add_argument("--allow-missing", action="append", default=[], metavar="PATH",
                        help="a path, relative to --root, that may be absent for now")
    parser.add_argument("files", nargs="*", type=Path,
                        help="Markdown files (default: every one in the repository but built output)")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    book_src = root / "docs" / "src"
    files = args.files or markdown_files(root)
    anchors = Anchors(book_src, args.html)
    allow = {(root / p).resolve() for p in args.allow_missing}
    report = check(files, root, anchors, allow)
    if args.html is not None:
        repointed = repoint_html(args.html, root)
        print(f"built book: {repointed} links to repository Markdown files given back their .md")
        report.broken += check_html(args.html, root)
    for line in report.external:
        print(f"external (not fetched): {line}")
    for line in report.allowed_missing:
        print(f"missing, allowed for now: {line}")
    for line in report.broken:
        print(f"BROKEN: {line}", file=sys.stderr)
    print(f"links: {report.checked} checked in {len(files)} files, {len(report.external)} external, "
          f"{len(report.broken)} broken")
    return 1 if report.broken else 0


if __name__ == "__main__":
    sys.exit(main())
