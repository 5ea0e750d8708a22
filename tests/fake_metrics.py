"""A fake of Ray's metric classes (Counter / Gauge / Histogram) that keeps what it was given."""


class Fake:
    """One metric: its total (`value`), totals by tags (`by_tag`) and observations (`observed`)."""

    def __init__(self, name, description="", tag_keys=(), boundaries=None):
        self.name, self.tag_keys, self.default_tags = name, tag_keys, {}
        self.value, self.by_tag, self.observed = 0.0, {}, []

    def set_default_tags(self, tags):
        assert set(tags) <= set(self.tag_keys)
        self.default_tags = tags

    def inc(self, value=1.0, tags=None):
        self.value += value
        if tags:
            key = tuple(sorted(tags.items()))
            self.by_tag[key] = self.by_tag.get(key, 0.0) + value

    def set(self, value, tags=None):
        self.value = value

    def observe(self, value, tags=None):
        self.observed.append((value, tuple(sorted(tags.items()))) if tags else value)
