from hvdtrain.doctor.cli import main

main()
