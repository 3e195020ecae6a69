"""Build hook: what setup.cfg cannot say. The long description is README.md with every relative
link made absolute against the repository's address, and the project URLs come from that address;
setup.cfg's ``url`` is the one place it is written. Everything else is in setup.cfg."""

import configparser
import re
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent


def repository_url():
    config = configparser.ConfigParser()
    config.read(HERE / "setup.cfg", encoding="utf-8")
    return config["metadata"]["url"].rstrip("/")


def absolute_links(markdown, url):
    """``markdown`` with its relative links and images pointing into the repository at ``url``:
    images to the raw file, other files to their page. Anchors and absolute links stay."""
    def rewrite(match):
        bang, text, target = match.groups()
        if re.match(r"[a-z][a-z0-9+.-]*:|#|/", target):
            return match.group(0)
        kind = "raw" if bang else "blob"
        return f"{bang}[{text}]({url}/{kind}/HEAD/{target})"

    return re.sub(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)", rewrite, markdown)


URL = repository_url()

setup(
    long_description=absolute_links((HERE / "README.md").read_text(encoding="utf-8"), URL),
    long_description_content_type="text/markdown",
    project_urls={"Source": URL, "Issues": f"{URL}/issues", "Documentation": f"{URL}#readme"},
)
