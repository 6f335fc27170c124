"""argparse help that shows each flag's default once: not where the help text already says it
(argparse's ArgumentDefaultsHelpFormatter appends a second "(default: None)" there), and not
for flags without a value ("(default: None)" / "(default: False)" tell nobody anything)."""
from __future__ import annotations

import argparse


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "(default" in text or action.default in (None, False, argparse.SUPPRESS):
            return text
        return super()._get_help_string(action)
