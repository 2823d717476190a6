from kiln.cli.app import main

main()
