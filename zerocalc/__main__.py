from zerocalc.cli import main

main()
