"""A third-party operator plug-in: reverses a string field."""

import pescheduler
from pescheduler import Operator


class Reverse(Operator):
    name = "reverse"

    def __init__(self, field):
        self.field = field

    def process(self, batch, emit):
        f = self.field
        emit.many([{**t, f: t[f][::-1]} for t in batch])


@pescheduler.hookimpl
def pescheduler_operators():
    return [Reverse]
