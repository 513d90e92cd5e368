"""The simulator behind vLLM's HTTP interface, in real time (``chunktune sim serve``): the
aiohttp server (:mod:`.server`), the real-time engine loop (:mod:`.realtime`), vLLM's OpenAI
protocol (:mod:`.protocol`), its ``/metrics`` (:mod:`.metrics`) and token counting
(:mod:`.tokenizer`)."""
