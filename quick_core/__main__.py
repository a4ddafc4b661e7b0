from quickzones.cli import main

main()
