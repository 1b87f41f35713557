from harness.commands.cli import main

main()
