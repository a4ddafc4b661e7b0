from quick_core.cli import main

main()
