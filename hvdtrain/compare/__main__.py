from hvdtrain.compare.cli import main

main()
