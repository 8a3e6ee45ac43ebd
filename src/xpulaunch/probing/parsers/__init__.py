"""Pure parsers: tool output text in, plain values out. No I/O; fed from fixtures in tests."""
