"""The command line: click commands that parse, build a request, call :mod:`xpulaunch.launch`
or the API, and print. The only package that prints; nothing below it imports it."""
