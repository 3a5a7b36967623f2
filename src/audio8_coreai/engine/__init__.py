"""The engine: the frame loop (loop.py), speech as it is made (stream.py), utterances sharing calls (batch.py)."""
