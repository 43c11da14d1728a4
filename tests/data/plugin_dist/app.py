from pescheduler import Application

app = Application("reverse-words")
(app.source("iterable", items=[{"w": w, "ts": i} for i, w in enumerate(["stream", "dask", "pluggy"])])
    .apply("reverse", field="w")
    .sink("jsonl", path="out/reverse.jsonl"))
