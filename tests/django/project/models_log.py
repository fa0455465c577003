"""What the tasks did, appended to a file the test reads ($DIBS_DJANGO_LOG)."""

import os


def record(line: str) -> None:
    with open(os.environ["DIBS_DJANGO_LOG"], "a", encoding="utf-8") as log:
        log.write(line + "\n")
