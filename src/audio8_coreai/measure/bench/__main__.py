"""``python -m audio8_coreai.measure.bench --group|--rss|--worker JSON``: the benchmark's subprocess entry
(:func:`.workers.main`; use ``audio8 bench``)."""

from .workers import main

if __name__ == "__main__":
    main()
