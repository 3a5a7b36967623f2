"""The measuring tools, apart from the product: oracle parity (:mod:`.parity`), draw agreement of a precision
against fp32 (:mod:`.agreement`), speed and memory (:mod:`.bench`) and the quality gate (:mod:`.gate`)."""
