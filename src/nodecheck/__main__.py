from nodecheck.cli import main

main()
