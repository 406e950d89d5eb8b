"""check_links.py on small made-up repositories: each kind of broken link is
caught, and the links that are fine pass. Run: python3 -m unittest docs/test_check_links.py"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
import unittest
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_links  # noqa: E402


def repo(files: Dict[str, str]) -> Path:
    root = Path(tempfile.mkdtemp(prefix="check-links-"))
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


BOOK = {
    "DESIGN.md": "# Design\n\n## Lease timing\n",
    "docs/src/SUMMARY.md": "# Summary\n\n- [Agent](agent.md)\n- [Backends](backends/index.md)\n",
    "docs/src/agent.md": (
        "# The agent\n\n## Access\n\n### Stopping and restarting the agent\n\n"
        "## Meltano runs: `--meltano`\n\n## Access\n\n## Named {#custom-id}\n"
    ),
    "docs/src/backends/index.md": "# Backends\n\n#### PostgreSQL\n",
}


def run(root: Path, page: str, *extra: str) -> List[str]:
    """Broken-link lines for `page` with `extra` appended to it."""
    path = root / page
    path.write_text(path.read_text() + "\n" + "\n".join(extra) + "\n")
    anchors = check_links.Anchors(root / "docs" / "src", None)
    return check_links.check([path], root, anchors, set()).broken


class Slugs(unittest.TestCase):
    def test_github_and_mdbook_agree_on_these_headings(self) -> None:
        for text, slug in [
            ("Meltano runs: --meltano", "meltano-runs---meltano"),
            ("Meltano's four questions", "meltanos-four-questions"),
            ("At most N at once: slots", "at-most-n-at-once-slots"),
            ("Inside Meltano, without a wrapper", "inside-meltano-without-a-wrapper"),
            ("The file:// directory", "the-file-directory"),
        ]:
            self.assertEqual(check_links.github_slug(text), slug)
            self.assertEqual(check_links.mdbook_slug(text), slug)

    def test_heading_markup_is_dropped(self) -> None:
        text, explicit = check_links.heading_text("Meltano runs: `--meltano`")
        self.assertEqual((text, explicit), ("Meltano runs: --meltano", None))
        self.assertEqual(check_links.heading_text("[Link](x.md) and **bold** {#x}"), ("Link and bold", "x"))

    def test_repeated_headings_are_numbered(self) -> None:
        self.assertEqual(check_links.numbered(["a", "a", "b", "a"]), {"a", "a-1", "b", "a-2"})


class Links(unittest.TestCase):
    def test_good_links_pass(self) -> None:
        root = repo(BOOK)
        broken = run(
            root,
            "docs/src/agent.md",
            "[a](#access) [b](#access-1) [c](#meltano-runs---meltano) [d](#custom-id)",
            "[e](backends/index.md#postgresql) [f](../../DESIGN.md#lease-timing) [g](../../docs/)",
            "![h](backends/index.md) [i][ref] <https://example.com> [j](https://example.com/x#y)",
            "`[not a link](nowhere.md)`",
            "```\n[not a link either](nowhere.md)\n```",
            "[ref]: ../../DESIGN.md",
        )
        self.assertEqual(broken, [])

    def test_missing_file_is_broken(self) -> None:
        broken = run(repo(BOOK), "docs/src/agent.md", "see [x](nowhere.md)")
        self.assertEqual(len(broken), 1)
        self.assertIn("nowhere.md: no such file", broken[0])

    def test_missing_anchor_is_broken(self) -> None:
        broken = run(repo(BOOK), "docs/src/agent.md", "see [x](backends/index.md#postgres)")
        self.assertEqual(len(broken), 1)
        self.assertIn("no heading `#postgres`", broken[0])

    def test_missing_anchor_in_the_page_itself_is_broken(self) -> None:
        self.assertEqual(len(run(repo(BOOK), "docs/src/agent.md", "[x](#under-systemd)")), 1)

    def test_repository_file_counted_from_the_linking_file(self) -> None:
        # From docs/src/, DESIGN.md is two levels up: one level up is wrong.
        broken = run(repo(BOOK), "docs/src/agent.md", "[x](../DESIGN.md)")
        self.assertEqual(len(broken), 1)

    def test_readme_link_into_a_book_chapter_is_checked(self) -> None:
        root = repo({**BOOK, "README.md": "# runlock\n"})
        self.assertEqual(run(root, "README.md", "[x](docs/src/agent.md#access)"), [])
        self.assertEqual(len(run(root, "README.md", "[x](docs/src/agent.md#acces)")), 1)

    def test_undefined_reference_and_absolute_path_are_broken(self) -> None:
        broken = run(repo(BOOK), "docs/src/agent.md", "[x][nothing] [y](/etc/passwd) [z](../../../outside.md)")
        self.assertEqual(len(broken), 3)

    def test_anchor_must_exist_in_built_html_when_given(self) -> None:
        root = repo({**BOOK, "docs/book/agent.html": '<h1 id="the-agent">The agent</h1>'})
        page = root / "docs/src/agent.md"
        page.write_text(page.read_text() + "\n[x](#access)\n")
        anchors = check_links.Anchors(root / "docs" / "src", root / "docs" / "book")
        broken = check_links.check([page], root, anchors, set()).broken
        self.assertEqual(len(broken), 1)

    def test_built_pages_get_their_repository_links_back_and_are_checked(self) -> None:
        root = repo({**BOOK, "docs/book/agent.html": (
            '<a href="../../DESIGN.html#lease-timing">d</a> <a href="backends/index.html">b</a>'
            ' <a href="https://example.com/x.html">e</a> <img src="images/ui.png">')})
        (root / "docs/book/backends").mkdir()
        (root / "docs/book/backends/index.html").write_text("")
        self.assertEqual(check_links.repoint_html(root / "docs/book", root), 1)
        self.assertIn('href="../../DESIGN.md#lease-timing"', (root / "docs/book/agent.html").read_text())
        broken = check_links.check_html(root / "docs/book", root)
        self.assertEqual(broken, ["docs/book/agent.html: src=images/ui.png: no such file"])

    def test_include_needs_its_file_and_anchor(self) -> None:
        root = repo({**BOOK, "README.md": "# r\n<!-- ANCHOR: exit -->\n|a|\n<!-- ANCHOR_END: exit -->\n"})
        self.assertEqual(run(root, "docs/src/agent.md", "{{#include ../../README.md:exit}}"), [])
        broken = run(root, "docs/src/agent.md", "{{#include ../../README.md:exits}}", "{{#include ../README.md}}")
        self.assertEqual(len(broken), 2)
        self.assertIn("no ANCHOR/ANCHOR_END `exits`", broken[0])

    def test_allowed_missing_is_reported_not_broken(self) -> None:
        root = repo({**BOOK, "README.md": "# runlock\n\n![page](docs/src/images/ui.png)\n"})
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = check_links.main(["--root", str(root), "--allow-missing", "docs/src/images/ui.png"])
        self.assertEqual(status, 0, err.getvalue())
        self.assertIn("missing, allowed for now", out.getvalue())
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = check_links.main(["--root", str(root)])
        self.assertEqual(status, 1)
        self.assertIn("BROKEN: README.md:3: docs/src/images/ui.png: no such file", err.getvalue())


if __name__ == "__main__":
    unittest.main()
