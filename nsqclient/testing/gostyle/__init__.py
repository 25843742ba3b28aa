"""Go's ways, as the embedded servers need them: Go-style text (:mod:`.text`: ``%q``,
``json.Marshal``, ``time.Duration``) and Go's flag syntax (:mod:`.flags`: reading a command
line, its ``-help``, flag values a real binary reads)."""
